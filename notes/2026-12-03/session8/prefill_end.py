"""The bound with stores at the prefill's end (issue 25 diagnostic, notes only).

vLLM's connector stores only prompt blocks (``offload_prompt_only``, its default) and only as
the prefill computes them, so a block a request holds is in the tier no later than that
request's prefill end F, not its completion C. The bound's fact 1 with F in place of C is still
true of every policy in the replay's engine (it offers prompt blocks during the prefill, as
vLLM), so this is a tighter bound on every policy's run, not a diagnostic of one run. Usage:
python prefill_end.py POLICY[,POLICY...] SEEDS
"""

import dataclasses
import sys

import tenure.service.replay.engine as eng
from tenure.service.replay import bound as B
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

policies = sys.argv[1].split(",")
seeds = [int(s) for s in sys.argv[2].split(",")]
captured = {}
orig = eng.prefill_bound


def grab(log, capacity, work, *a, **k):
    if not k:
        captured["log"] = (log, capacity, work)
    return orig(log, capacity, work, *a, **k)


eng.prefill_bound = grab
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
for policy in policies:
    tot = {"saved": 0.0, "bound": 0.0, "f": 0.0, "v": 0.0}
    for seed in seeds:
        res = eng.simulate(trace, ReplayConfig(policy, hw, 32.0, 0.001, seed, bound=True))
        log, cap, work = captured["log"]
        flog = [dataclasses.replace(a, done_s=a.first_token_s) if a.first_token_s >= 0 else a for a in log]
        fb = B.prefill_bound(flog, cap, work).work
        vb = B.prefill_bound(log, cap, work, vllm_offers=True).work
        tot["saved"] += res.saved_work
        tot["bound"] += res.bound_work
        tot["f"] += fb
        tot["v"] += vb
        print(f"{policy} seed {seed}: saved/bound {res.saved_work / res.bound_work:.3f}, "
              f"F-bound {fb / res.bound_work:.3f} of the bound, saved/F-bound {res.saved_work / fb:.3f}, "
              f"vLLM-timed LP {vb / res.bound_work:.3f}", flush=True)
    print(f"{policy} pooled: saved/bound {tot['saved'] / tot['bound']:.3f}, saved/F-bound "
          f"{tot['saved'] / tot['f']:.3f}, F-bound/bound {tot['f'] / tot['bound']:.3f}, "
          f"saved/vLLM-timed {tot['saved'] / tot['v']:.3f}", flush=True)
