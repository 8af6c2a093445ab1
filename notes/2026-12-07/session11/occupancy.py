"""Time-integrated tier occupancy (share of capacity x time) by the holding session's state,
`tenure-density` at the acceptance point.

Usage: python occupancy.py [SEED]
"""
import sys, collections
import tenure.service.replay.engine as eng
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.registry import register_policy
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
T = collections.Counter()
class P(TenureDensity):
    name = "td-occ"
    _t = 0.0
    def _tick(self, now):
        dt = now - self._t
        if dt > 0:
            for s, b in self.tier.resident_sessions():
                life = self.lives.get(s)
                st = "none" if life is None else "finished" if life.finished else ("active" if life.active else "idle")
                T[st] += b * dt
            T["cap"] += (self.tier.capacity or 0) * dt
            T["full_s"] += dt if self.tier.used >= 0.95 * (self.tier.capacity or 0) else 0.0
            T["span_s"] += dt
            self._t = now
    def on_request_start(self, s, now): self._tick(now); super().on_request_start(s, now)
    def on_access(self, s, r, i, now): self._tick(now); super().on_access(s, r, i, now)
    def on_lookup(self, s, b, h, now): self._tick(now); super().on_lookup(s, b, h, now)
    def select_victims(self, n, inc, prot, now): self._tick(now); return super().select_victims(n, inc, prot, now)
register_policy("td-occ", f"{__name__}:P")
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
trace = load_claude_code(claude_code_trace(), max_roots=200)
res = eng.simulate(trace, ReplayConfig("td-occ", get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=False))
cap, full, span = T.pop("cap"), T.pop("full_s"), T.pop("span_s")
print(f"seed {seed}: share of capacity x time held by", {k: round(v / cap, 3) for k, v in T.items()},
      f"; tier at >= 95% of capacity {full / span:.1%} of the time")
