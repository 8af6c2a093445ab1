import sys, pickle
import tenure.service.replay.engine as eng
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
res = eng.simulate(trace, ReplayConfig(policy, get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=True))
pickle.dump(captured["log"], open(f"/work/s9/log_{policy}_{seed}.pkl", "wb"))
print(policy, seed, "saved/bound", round(res.saved_work / res.bound_work, 3), "F", round(res.saved_work / res.bound_prefill_work, 3))
