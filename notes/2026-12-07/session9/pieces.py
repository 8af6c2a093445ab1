"""How much the bound tightens with more prefix pieces per request (valid: fact 3 on smaller groups)."""
import sys, time, pickle
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
    if not k:
        captured["log"] = (log, capacity, work)
    return orig(log, capacity, work, *a, **k)
eng.prefill_bound = grab
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
res = eng.simulate(trace, ReplayConfig(policy, hw, 32.0, 0.001, seed, bound=True))
log, cap, work = captured["log"]
pickle.dump(captured["log"], open(f"/work/s9/log_{policy}_{seed}.pkl", "wb"))
print(f"{policy} seed {seed}: saved {res.saved_work:.4g} bound {res.bound_work:.4g} F {res.bound_prefill_work:.4g} p95 {res.p95_ttft_s if hasattr(res,'p95_ttft_s') else ''}")
for pieces in (1, 4, 16, 64):
    t = time.time()
    b = B.prefill_bound(log, cap, work, pieces, prefill_stores=True)
    print(f"pieces {pieces}: F-bound {b.work:.4g} ({b.work / res.bound_work:.3f} of bound), saved/it {res.saved_work / b.work:.3f}, {b.intervals} vars, {time.time() - t:.1f}s", flush=True)
