"""Where the bound's value lies that a policy does not reach (issue 25 diagnostic, notes only).

Runs one policy at the acceptance point (first 200 sessions, 0.001/s, 32 GiB, H100), solves the
bound's LP on its access log, and splits both the LP's credit and the policy's saved work by
the hold time a hit needs (with a third argument ``vllm``: the vLLM-timed diagnostic LP; the request's lookup minus its first group's availability: how long
a block must sit in the tier to serve it). Usage: python bound_where.py POLICY SEED
"""
import sys
from collections import defaultdict

import numpy as np

import tenure.service.replay.engine as eng
from tenure.service.replay import bound as B
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

policy, seed = sys.argv[1], int(sys.argv[2])
captured = {}
orig = eng.prefill_bound


def grab(log, capacity, work, *a, **k):
    captured.setdefault("log", (log, capacity, work))
    return orig(log, capacity, work, *a, **k)


eng.prefill_bound = grab
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
res = eng.simulate(trace, ReplayConfig(policy, hw, 32.0, 0.001, seed, bound=True))
log, cap, work = captured["log"]
# Each LP interval's request: the loop in ``bound._intervals`` reads the log in order and
# cuts each request's groups with ``_split``; record the request being read at each cut.
cur, owner = [0], []
orig_split = B._split


def split(lo, hi, parts):
    pieces = orig_split(lo, hi, parts)
    owner.extend([cur[0]] * len(pieces))
    return pieces


def reading(log):
    for r, acc in enumerate(log):
        cur[0] = r
        yield acc


B._split = split
VLLM = len(sys.argv) > 3 and sys.argv[3] == "vllm"
iv = B._intervals(reading(log), work, 1, vllm_offers=VLLM)
B._split = orig_split
n = len(iv.start)
values = np.array(iv.value)
lp_core, z, _m = B._solve(iv, cap)  # the bound's own LP, its solution kept
lp = float(values @ z) + iv.free
print(f"{policy} seed {seed} {'vLLM-timed LP' if VLLM else 'bound'}: saved {res.saved_work:.4g}, bound {res.bound_work:.4g} (re-solved {lp:.4g}), "
      f"saved/bound {res.saved_work / res.bound_work:.3f}, free {iv.free / lp:.3f} of it")

# Hold time of each request's first LP group (its lookup minus availability).
by_request = defaultdict(list)
for i in range(n):
    by_request[owner[i]].append(i)
edges = [0, 10, 60, 300, 1800, 7200, float("inf")]
names = ["<10 s", "10-60 s", "1-5 min", "5-30 min", "30 min-2 h", ">2 h"]
lp_by, pol_by, all_by = defaultdict(float), defaultdict(float), defaultdict(float)
for r, acc in enumerate(log):
    idx = by_request.get(r, [])
    hold = min((iv.end[i] - iv.start[i] for i in idx), default=None)
    b = "free/none" if hold is None else names[np.searchsorted(edges, hold, side="right") - 1]
    lp_by[b] += sum(values[i] * z[i] for i in idx)
    all_by[b] += sum(values[i] for i in idx)
    pol_by[b] += work.range(acc.gpu_hit, acc.gpu_hit + acc.host_hit)
tot = lp - iv.free
print(f"{'hold time':>12} {'LP credit':>10} {'policy':>10} {'pol/LP':>7} {'LP z-mean':>9}")
for b in names + ["free/none"]:
    if lp_by[b] or pol_by[b]:
        print(f"{b:>12} {lp_by[b] / tot:10.3f} {pol_by[b] / tot:10.3f} "
              f"{pol_by[b] / lp_by[b] if lp_by[b] else float('nan'):7.2f} "
              f"{lp_by[b] / all_by[b] if all_by[b] else float('nan'):9.2f}")
