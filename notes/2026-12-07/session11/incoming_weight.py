"""Dev-seed probe (seeds 10-13): scale the incoming store's density by K before it is compared with
the residents' (K < 1 favours residents, K > 1 the store).

Usage: PYTHONPATH=notes/2026-12-07/session11 python notes/2026-12-07/session11/incoming_weight.py 0.25,0.5,1,2,4
"""
import sys, json
from concurrent.futures import ProcessPoolExecutor
import tenure.service.replay.engine as eng
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.registry import register_policy
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

class K(TenureDensity):
    name = "td-k"
    K = 1.0
    def _incoming_density(self, incoming, protected, now):
        return super()._incoming_density(incoming, protected, now) * self.K
register_policy("td-k", "incoming_weight:K")

def run(args):
    k, seed = args
    import incoming_weight; incoming_weight.K.K = k
    trace = load_claude_code(claude_code_trace(), max_roots=200)
    r = eng.simulate(trace, ReplayConfig("td-k", get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=True))
    import numpy as np; return k, seed, r.saved_work, r.bound_work, round(float(np.percentile(np.array(r.jct_s), 95)), 1)

if __name__ == "__main__":
    ks = [float(x) for x in sys.argv[1].split(",")]
    seeds = [10, 11, 12, 13]
    with ProcessPoolExecutor(2) as ex:
        res = list(ex.map(run, [(k, s) for k in ks for s in seeds]))
    for k in ks:
        rows = [r for r in res if r[0] == k]
        sv = sum(r[2] for r in rows); bd = sum(r[3] for r in rows)
        print(f"K={k}: pooled saved/bound {sv/bd:.3f}; per seed", [round(r[2]/r[3], 3) for r in rows], "p95", [r[4] for r in rows])
