"""A digest of a replay run (turn times and counters), to check that a change moves no decision.

Usage: python digest.py POLICY SEED:RATE:GIB[:HARDWARE[:MAX_ROOTS]] ...  (run it in both trees)
"""
import sys, hashlib, json
import tenure, tenure.service.replay.engine as eng
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace
print(tenure.__file__)
pol = sys.argv[1]
for arg in sys.argv[2:]:
    parts = arg.split(":")
    seed, rate, gib = parts[:3]
    hw = parts[3] if len(parts) > 3 else "h100-llama3-8b"
    roots = int(parts[4]) if len(parts) > 4 else 200
    trace = load_claude_code(claude_code_trace(), max_roots=roots)
    r = eng.simulate(trace, ReplayConfig(pol, get_profile(hw), float(gib), float(rate), int(seed), bound=False))
    h = hashlib.sha256(bytes(r.jct_s) + json.dumps(r.counters, sort_keys=True).encode()).hexdigest()[:16]
    print(arg, h, r.counters.get("stored_blocks"), r.counters.get("refusals"))
