"""Probe: tenure-density without "one refusal per request" (later offers of a refused request
may be admitted, leaving a hole in its stored context), on the dev seeds.

Session 10's short_gaps.py found that nine tenths of the missed blocks were refused at the
previous turn. After one refusal the policy refuses the request's every later offer, so that a
stored context never has a hole. A hole before where the GPU's copy ends does no harm, since
vLLM looks the tier up from the GPU hit on.

The same for the gate (``tenure-holes``).

Usage: python holes.py [SEEDS]
"""

from __future__ import annotations

import sys

import numpy as np

import tenure.service.replay.engine as eng
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.gate import TenureGate
from tenure.service.policy.registry import register_policy
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace


class Holes(TenureDensity):
    name = "tenure-density-holes"

    def refused_already(self, incoming: str | None) -> bool:
        return False


class GateHoles(TenureGate):
    name = "tenure-holes"

    def refused_already(self, incoming: str | None) -> bool:
        return False


register_policy("tenure-density-holes", f"{__name__}:Holes")
register_policy("tenure-holes", f"{__name__}:GateHoles")

if __name__ == "__main__":
    seeds = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "10,11,12,13").split(",")]
    trace = load_claude_code(claude_code_trace(), max_roots=200)
    hw = get_profile("h100-llama3-8b")
    for policy in ("tenure-density", "tenure-density-holes", "tenure", "tenure-holes"):
        s = b = 0.0
        p95 = []
        for seed in seeds:
            res = eng.simulate(trace, ReplayConfig(policy, hw, 32.0, 0.001, seed, bound=True))
            s += res.saved_work
            b += res.bound_work
            p95.append(float(np.percentile(res.jct_s, 95)))
        print(f"{policy}: seeds {seeds} saved/bound pooled {s / b:.3f}; turn p95 "
              f"{' / '.join(f'{x:.1f}' for x in p95)} s", flush=True)
