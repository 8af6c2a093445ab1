"""Distribution of the GPU hit at returning turns, as a share of the previous turn's context
(acceptance point). Usage: python gpu_hit_at_return.py [SEED] [POLICY]
"""
import sys, collections
import numpy as np
import tenure.service.replay.engine as eng
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
policy = sys.argv[2] if len(sys.argv) > 2 else "tenure-density"
cap = {}
orig = eng.Engine._bound if hasattr(eng, "Engine") else None
cls = [c for c in vars(eng).values() if isinstance(c, type) and hasattr(c, "_bound")][0]
orig = cls._bound
def grab(self, res, admitted):
    cap["log"] = list(admitted)
    orig(self, res, admitted)
cls._bound = grab
trace = load_claude_code(claude_code_trace(), max_roots=200)
res = eng.simulate(trace, ReplayConfig(policy, get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=True))
print("saved/bound", res.saved_work / res.bound_work)
log = cap["log"]
last = {}  # first seg -> (context blocks, done)
rows = []
for r in sorted(log, key=lambda r: r.lookup_s):
    n = sum(b - a for _s, a, b in r.runs)
    key = r.runs[0][0] if r.runs else None
    if key in last:
        nprev, done = last[key]
        rows.append((r.lookup_s - done, nprev, n, r.gpu_hit, r.host_hit))
    last[key] = (n, r.done_s)
rows = np.array(rows)
gap, nprev, n, g, h = rows.T
share = g / np.maximum(1, np.minimum(nprev, n))
print("returns", len(rows))
for lo, hi, name in [(0,10,"<10s"),(10,60,"10-60s"),(60,300,"1-5m"),(300,1800,"5-30m"),(1800,1e12,">30m")]:
    m = (gap >= lo) & (gap < hi)
    if not m.any(): continue
    s = share[m]
    print(f"{name:>7} n={m.sum():5d} g=0:{(s<=0.01).mean():.2f} partial:{((s>0.01)&(s<0.99)).mean():.2f} full:{(s>=0.99).mean():.2f} "
          f"blocks past-GPU-of-prev: zero-g {np.sum((nprev-g)[m & (share<=0.01)]):.0f} partial {np.sum(np.maximum(0,nprev-g)[m & (share>0.01)&(share<0.99)]):.0f} host hit {h[m].sum():.0f}")
