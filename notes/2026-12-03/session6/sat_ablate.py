"""Saturated point (0.005/s, 128 GiB, first 200 Claude Code sessions): which part of the gap
learner's merge moved tenure's p95 (1673.6 -> 1682.3)? One variant per process call."""
import json, sys, time
from dataclasses import replace
from tenure.service.policy.gate import TenureGate
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
import numpy as np
percentile = lambda v, q: float(np.percentile(np.asarray(v), q))

variant, seeds = sys.argv[1], [int(s) for s in sys.argv[2].split(",")]
rate = float(sys.argv[3]) if len(sys.argv) > 3 else 0.005
gib = float(sys.argv[4]) if len(sys.argv) > 4 else 128.0
params = {}
policy = "tenure"
if variant == "old":          # the predictor's stop-blind median for unhinted turns, no learner
    TenureGate.learns_gaps = False
    params = {"learn_gaps": 0.0}
elif variant == "median+learner":  # stop-blind median sent; learner only where it is None
    TenureGate.learns_gaps = False
elif variant == "horizon":    # no gap sent, no learner: the one horizon
    params = {"learn_gaps": 0.0}
elif variant.startswith("q"):
    params = {"gap_quantile": float(variant[1:])}
elif variant == "density":
    policy = "tenure-density"
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
jct = []
t = time.time()
for s in seeds:
    r = simulate(trace, ReplayConfig(policy, hw, gib, rate, s, policy_params=params or None))
    jct += list(r.jct_s)
print(json.dumps({"variant": variant, "seeds": seeds, "rate": rate, "gib": gib,
                  "p50": percentile(jct, 50), "p95": percentile(jct, 95), "s": time.time() - t}))
