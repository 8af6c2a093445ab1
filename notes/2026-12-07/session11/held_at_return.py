"""At returning turns (`tenure-density`, acceptance point): the blocks the tier held for the
session when its request started, the blocks its lookup loaded, and held blocks x gap, by gap class.

Usage: python held_at_return.py [SEED]
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
    name = "td-probe"
    def on_request_start(self, session, now):
        life = self.lives.get(session)
        if life is not None and not life.active and life.last_activity > 0:
            self._h = getattr(self, "_h", {}); self._h[session] = (self.tier.session_resident.get(session, 0), now - life.last_activity)
        super().on_request_start(session, now)
    def on_lookup(self, session, blocks, hit, now):
        h = getattr(self, "_h", {}).pop(session, None)
        if h is not None:
            held, gap = h
            c = "<10" if gap < 10 else "10-60" if gap < 60 else "60-300" if gap < 300 else ">300"
            T[c, "n"] += 1; T[c, "held"] += held; T[c, "hit"] += hit; T[c, "past"] += blocks
            T[c, "held>0"] += held > 0; T[c,"bs_hit0"] += held*gap*(hit==0); T[c,"bs_hit"] += held*gap*(hit>0); T[c,"gain_bs"] += hit*gap; T[c, "held>0,hit0"] += (held > 0 and hit == 0)
        super().on_lookup(session, blocks, hit, now)
import tenure.service.policy.registry as reg
register_policy("td-probe", f"{__name__}:P")
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
trace = load_claude_code(claude_code_trace(), max_roots=200)
res = eng.simulate(trace, ReplayConfig("td-probe", get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=False))
for c in ["<10", "10-60", "60-300", ">300"]:
    print(c, {k: T[c, k] for k in ["n", "held", "hit", "past", "held>0", "held>0,hit0", "bs_hit0", "bs_hit", "gain_bs"]})
