"""How much of the GPU lever the learned yield captures: tenure-density with and without it."""
import sys
import tenure.service.replay.engine as eng
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
for ly in (1.0, 0.0):
    s = b = 0.0
    for seed in (0, 1, 2):
        res = eng.simulate(trace, ReplayConfig("tenure-density", hw, 32.0, 0.001, seed, bound=True, policy_params={"learn_yield": ly}))
        s += res.saved_work; b += res.bound_work
        print(f"learn_yield {ly} seed {seed}: saved/bound {res.saved_work / res.bound_work:.3f}", flush=True)
    print(f"learn_yield {ly} pooled: {s / b:.3f}", flush=True)
