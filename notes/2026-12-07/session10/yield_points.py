"""Fewer gap points in tenure-density's yield mean: what it does to results (dev seeds) and cost.

The yield's mean over 16 points of the gap spread is most of tenure-density's decision cost
once lookups are reported. ``GapSpread.points`` sets how many points a residual carries; only
the yield's mean reads them. This probe sets it per run, on the dev split's seeds (10-13) at
the acceptance point, and times the policy with ``tenure bench policy``'s own driver.

Usage: python yield_points.py [POINTS,...] [SEEDS]
"""

from __future__ import annotations

import sys

import numpy as np

import tenure.service.replay.engine as eng
from tenure.benchmarks.policy import Workload, measure
from tenure.service.policy.density import TenureDensity
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

POINTS = {"k": 16}
_init = TenureDensity.__init__


def _init_k(self, params=None):  # type: ignore[no-untyped-def]
    _init(self, params)
    self.spread.points = POINTS["k"]


TenureDensity.__init__ = _init_k  # type: ignore[method-assign]

if __name__ == "__main__":
    ks = [int(k) for k in (sys.argv[1] if len(sys.argv) > 1 else "16,8,4,2").split(",")]
    seeds = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "10,11,12,13").split(",")]
    trace = load_claude_code(claude_code_trace(), max_roots=200)
    hw = get_profile("h100-llama3-8b")
    for k in ks:
        POINTS["k"] = k
        s = b = 0.0
        p95 = []
        for seed in seeds:
            res = eng.simulate(trace, ReplayConfig("tenure-density", hw, 32.0, 0.001, seed, bound=True))
            s += res.saved_work
            b += res.bound_work
            p95.append(float(np.percentile(res.jct_s, 95)))
        w = Workload(sessions=100, requests=3000)
        cost = []
        for _ in range(2):
            lru, den = measure("vllm-lru", w), measure("tenure-density", w)
            cost.append(den.cpu_ns / den.ops / (lru.cpu_ns / lru.ops))
        print(f"points {k}: dev seeds {seeds} saved/bound pooled {s / b:.3f}; turn p95 "
              f"{' / '.join(f'{x:.1f}' for x in p95)} s; bench per call x LRU "
              f"{' / '.join(f'{c:.2f}' for c in cost)}", flush=True)
