"""Why tenure-density misses returning turns' host hits, by the length of the gap before them.

For every request of a session that ran before, at its admission: the blocks it looked up past
the GPU hit (b) and the host hit among them (h). Between the session's previous turn's end and
this admission, the blocks of the session the tier evicted (e); during the previous turn, the
blocks of its offers the tier refused (r). The missed blocks b - h are then split, per request:
first to evictions in the gap (up to e), then to refusals (up to r), and the rest to "other"
(the prefix rule: a hit stops at the first missing block, and blocks stored earlier than the
previous turn). Shares are by blocks, totals over the run.

Usage: python short_gaps.py [SEED] [POLICY]   (POLICY: tenure-density (default) or tenure)
"""

from __future__ import annotations

import sys
from collections import defaultdict

import tenure.service.replay.engine as eng
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.gate import TenureGate
from tenure.service.policy.registry import register_policy
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

CLASSES = [(10.0, "< 10 s"), (60.0, "10-60 s"), (300.0, "1-5 min"), (1800.0, "5-30 min"), (float("inf"), ">= 30 min")]
TOTALS: dict[str, list[float]] = defaultdict(lambda: [0.0] * 6)  # n, b, h, e, r, other


def cls_of(gap: float) -> str:
    return next(name for top, name in CLASSES if gap < top)


def logged(base):  # type: ignore[no-untyped-def]
    class Logged(base):  # type: ignore[misc, valid-type]
        name = base.name + "-logged"

        def __init__(self, params=None):  # type: ignore[no-untyped-def]
            super().__init__(params)
            self.ended: dict[str, float] = {}
            self.evicted: dict[str, int] = defaultdict(int)
            self.refused: dict[str, int] = defaultdict(int)
            self.refused_prev: dict[str, int] = {}
            self.evicted_gap: dict[str, int] = {}

        def on_request_start(self, session, now):  # type: ignore[no-untyped-def]
            super().on_request_start(session, now)

        def on_access(self, session, runs, inserted, now):  # type: ignore[no-untyped-def]
            super().on_access(session, runs, inserted, now)
            self.ended[session] = now
            self.evicted[session] = 0
            self.refused_prev[session] = self.refused.pop(session, 0)

        def on_remove(self, run):  # type: ignore[no-untyped-def]
            super().on_remove(run)
            self.evicted[self.tier.owner(run.seg)] += run.blocks

        def on_refused(self, session, runs, now):  # type: ignore[no-untyped-def]
            super().on_refused(session, runs, now)
            self.refused[session] += sum(r.blocks for r in runs)

        def on_lookup(self, session, blocks, hit, now):  # type: ignore[no-untyped-def]
            super().on_lookup(session, blocks, hit, now)
            end = self.ended.get(session)
            if end is None:
                return
            t = TOTALS[cls_of(now - end)]
            missed = max(0, blocks - hit)
            e = min(missed, self.evicted.get(session, 0))
            r = min(missed - e, self.refused_prev.get(session, 0))
            for i, v in enumerate((1, blocks, hit, e, r, missed - e - r)):
                t[i] += v

    return Logged


register_policy("tenure-density-logged", f"{__name__}:DensityLogged")
register_policy("tenure-logged", f"{__name__}:GateLogged")
DensityLogged = logged(TenureDensity)
GateLogged = logged(TenureGate)

if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    policy = (sys.argv[2] if len(sys.argv) > 2 else "tenure-density") + "-logged"
    trace = load_claude_code(claude_code_trace(), max_roots=200)
    eng.simulate(trace, ReplayConfig(policy, get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=False))
    print(f"{policy} seed {seed}: returning requests by the gap before them (blocks)")
    print(f"{'gap':>10} {'requests':>9} {'past GPU':>10} {'host hit':>10} {'hit %':>6} {'evicted in gap':>15} {'refused at prev':>16} {'other':>8}")
    for _, name in CLASSES:
        n, b, h, e, r, o = TOTALS[name]
        if n:
            print(f"{name:>10} {n:>9.0f} {b:>10.0f} {h:>10.0f} {100 * h / max(b, 1):>5.1f}% "
                  f"{e:>15.0f} {r:>16.0f} {o:>8.0f}")
