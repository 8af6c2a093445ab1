"""Paired, session-clustered p95 delta: tenure (learner for unhinted turns) minus the pre-merge
rule (the predictor's stop-blind median), at one point, given seeds."""
import json, sys
from tenure.service.policy.gate import TenureGate
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
from tenure.service.replay.metrics import samples
from tenure.service.replay.stats import paired_delta, percentile

seeds = [int(s) for s in sys.argv[1].split(",")]
rate, gib, hwn = float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile(hwn)
runs = {}
for name, learns, params in [("learner", True, None), ("median", False, {"learn_gaps": 0.0})]:
    TenureGate.learns_gaps = learns
    runs[name] = [simulate(trace, ReplayConfig("tenure", hw, gib, rate, s, policy_params=params)) for s in seeds]
TenureGate.learns_gaps = True
a, b = samples(runs["learner"], "jct_s"), samples(runs["median"], "jct_s")
print(json.dumps({"seeds": seeds, "rate": rate, "gib": gib, "hw": hwn,
  "p95_learner": percentile(a, 95), "p95_median": percentile(b, 95),
  "per_seed": [[percentile([x], 95), percentile([y], 95)] for x, y in zip(a, b)],
  "delta_ci": list(paired_delta(a, b, 95, 1000))}))
