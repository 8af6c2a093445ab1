"""How much of the bound an integral, clairvoyant schedule can take (issue 25 diagnostic, notes only).

Runs one policy at the acceptance point (first 200 sessions, 0.001/s, 32 GiB, H100) with the
bound, keeps its access log, and solves four programs on it: the bound's LP; the same program
with every group held whole or not at all (a MILP: what a clairvoyant policy that knows every
future access of this run, and holds request groups whole, could save); the vLLM-timed
diagnostic LP (blocks available only when vLLM's connector offers them, from the prefill's end);
and its MILP. Usage: python integral.py POLICY SEED [TIME_LIMIT_S]
"""

import sys
import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_array

import tenure.service.replay.engine as eng
from tenure.service.replay import bound as B
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

policy, seed = sys.argv[1], int(sys.argv[2])
limit = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
captured = {}
orig = eng.prefill_bound


def grab(log, capacity, work, *a, **k):
    captured.setdefault("log", (log, capacity, work))
    return orig(log, capacity, work, *a, **k)


eng.prefill_bound = grab
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
t0 = time.time()
res = eng.simulate(trace, ReplayConfig(policy, hw, 32.0, 0.001, seed, bound=True))
print(f"replay {time.time() - t0:.0f} s", flush=True)
log, cap, work = captured["log"]


def integral(iv: B._Intervals, capacity: int) -> tuple[float, str, float, float]:
    """max sum W z, z in {0,1} (a group bigger than the tier: 0), capacity at every time point,
    prefix chains: the same rows as ``bound._solve`` (capacity written per time point)."""
    n = len(iv.start)
    starts, ends = np.array(iv.start), np.array(iv.end)
    sizes = np.array(iv.size, dtype=np.float64)
    values = np.array(iv.value)
    times = np.unique(np.concatenate([starts, ends]))
    m = len(times)
    a_idx = np.searchsorted(times, starts)
    b_idx = np.searchsorted(times, ends)
    # u_k = load over [t_k, t_{k+1}) in blocks: u_k - u_{k-1} = starts - ends at k, u_k <= cap.
    rows = np.concatenate([a_idx, b_idx, np.arange(m), np.arange(1, m)])
    cols = np.concatenate([np.arange(n), np.arange(n), n + np.arange(m), n + np.arange(m - 1)])
    data = np.concatenate([-sizes, sizes, np.ones(m), -np.ones(m - 1)])
    cons = [LinearConstraint(csr_array((data, (rows, cols)), shape=(m, n + m)), 0.0, 0.0)]
    if iv.chain:
        pairs = np.array(iv.chain, dtype=np.int64)
        k = len(pairs)
        a_ub = csr_array(
            (np.concatenate([-np.ones(k), np.ones(k)]),
             (np.concatenate([np.arange(k), np.arange(k)]), pairs.T.ravel())),
            shape=(k, n + m),
        )
        cons.append(LinearConstraint(a_ub, -np.inf, 0.0))
    upper = np.where(sizes <= capacity, 1.0, 0.0)
    top = float(values.max())
    c = np.concatenate([-values / top, np.zeros(m)])
    lb = np.zeros(n + m)
    ub = np.concatenate([upper, np.full(m, float(capacity))])
    integ = np.concatenate([np.ones(n), np.zeros(m)])
    t = time.time()
    r = milp(c, constraints=cons, bounds=Bounds(lb, ub), integrality=integ,
             options={"time_limit": limit, "mip_rel_gap": 1e-3, "disp": False})
    val = float(-r.fun) * top if r.x is not None else float("nan")
    dual = getattr(r, "mip_dual_bound", None)
    dual_v = float(-dual) * top if dual is not None else float("nan")
    return val, r.message, time.time() - t, dual_v


saved = res.saved_work
bound = res.bound_work
print(f"{policy} seed {seed}: saved {saved:.4g}, bound {bound:.4g}, saved/bound {saved / bound:.3f}")
for name, vllm in (("bound", False), ("vLLM-timed", True)):
    iv = B._intervals(log, work, 1, vllm_offers=vllm)
    lp, _z, _m = B._solve(iv, cap)
    lp += iv.free
    print(f"  {name} LP: {lp / bound:.3f} of the bound ({len(iv.start)} groups)", flush=True)
    val, msg, secs, dual = integral(iv, cap)
    print(f"  {name} MILP (groups whole): {(val + iv.free) / bound:.3f} of the bound, "
          f"dual bound {(dual + iv.free) / bound:.3f}, {secs:.0f} s, {msg}", flush=True)
    print(f"    the policy's saved work is {saved / (val + iv.free):.3f} of this MILP", flush=True)
