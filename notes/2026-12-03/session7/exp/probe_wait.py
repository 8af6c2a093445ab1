import sys
sys.path.insert(0, __import__("os").path.dirname(__file__))
from collections import Counter
import dens_active as D
from tenure.service.policy.registry import register_policy
stats = Counter()
pending = {}  # session -> list of evicted (seg, start, stop)

class Probe(D.TenureDensityActiveWaiting):
    name = "probe-wait"
    def select_victims(self, n, incoming, protected, now):
        r = super().select_victims(n, incoming, protected, now)
        if r:
            for v in r:
                owner = self.tier.owner(v.run.seg)
                life = self.lives.get(owner)
                if life is not None and life.active and owner not in self._looked:
                    pending.setdefault(owner, []).append((v.run.seg, v.run.start, v.run.stop))
                    stats["evicted_waiting_blocks"] += v.run.blocks
                elif life is not None and life.active:
                    stats["evicted_active_looked_blocks"] += v.run.blocks
                else:
                    stats["evicted_idle_blocks"] += v.run.blocks
        return r
    def on_lookup(self, session, runs, hit, now):
        ev = pending.pop(session, None)
        if ev is not None:
            # runs: context from the GPU hit on; blocks of a seg before runs' start are GPU-held
            first = {r.seg: r.start for r in runs}
            for seg, a, b in ev:
                if seg not in first:
                    stats["evicted_gpu_covered"] += b - a   # whole seg before the GPU hit (or not in context)
                else:
                    s0 = first[seg]
                    stats["evicted_gpu_covered"] += max(0, min(b, s0) - a)
                    stats["evicted_needed"] += max(0, b - max(a, s0))
        super().on_lookup(session, runs, hit, now)

register_policy("probe-wait", "probe_wait:Probe")
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
trace = load_claude_code(claude_code_trace(), max_roots=200)
for s in (10, 11):
    simulate(trace, ReplayConfig("probe-wait", get_profile("h100-llama3-8b"), 32.0, 0.001, s))
print(dict(stats))
