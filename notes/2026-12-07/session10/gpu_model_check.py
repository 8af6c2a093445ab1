"""How well the GPU free queue's present state predicts a session's GPU hit at its next turn.

At each request's end (its blocks freed into the GPU's queue) the probe records, for each of the
session's segments, its cached blocks and the blocks the GPU frees before it (empty room plus
the evictable blocks ahead in the queue), and the count of blocks placed on the GPU so far. At
the session's next admission it compares the real GPU hit with what the LRU drift model of
``gpu_probe.py`` predicts from that record, given the real number X of blocks placed on the GPU
in between: kept = sum over segments of c - min(c, max(0, X - ahead)). Run under
tenure-density (the host policy changes which blocks load, not the GPU's own order much).

Usage: python gpu_model_check.py [SEED]
"""

from __future__ import annotations

import sys

import numpy as np

import tenure.service.replay.engine as eng
import tenure.service.replay.gpu_pool as gpu_pool
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.registry import register_policy
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

STATE: dict = {"alloc": 0, "snap": {}, "last_hit": None, "rows": [], "owner": None, "gpu": None}


class Checked(TenureDensity):
    name = "tenure-density-checked"

    def on_lookup(self, session: str, blocks: int, hit: int, now: float) -> None:
        super().on_lookup(session, blocks, hit, now)
        STATE["alloc"] += blocks

    def on_request_admitted(self, session: str, now: float) -> None:
        super().on_request_admitted(session, now)
        snap = STATE["snap"].pop(session, None)
        last = STATE["last_hit"]
        if snap is None or last is None:
            return
        alloc0, segs = snap
        x = STATE["alloc"] - alloc0
        kept = sum(c - min(c, max(0, x - a)) for c, a in segs)
        present = sum(c for c, _ in segs)
        STATE["rows"].append((last, kept, present, x))


register_policy("tenure-density-checked", f"{__name__}:Checked")
_hit, _release = gpu_pool.GpuPrefixCache.hit, gpu_pool.GpuPrefixCache.release


def hit(self, runs):  # type: ignore[no-untyped-def]
    out = _hit(self, runs)
    STATE["last_hit"] = out
    return out


def release(self, runs, extra_blocks):  # type: ignore[no-untyped-def]
    _release(self, runs, extra_blocks)
    owner = STATE["owner"]
    if owner is None or not runs:
        return
    ahead: dict[int, int] = {}
    acc = self.capacity - self.held
    for seg in self._free:
        ahead[seg] = acc
        acc += self.cached[seg]
    segs = [(self.cached[s], ahead.get(s, acc)) for s, _a, _b in runs if self.cached[s] > 0]
    STATE["snap"][owner[runs[0][0]]] = (STATE["alloc"], segs)


gpu_pool.GpuPrefixCache.hit = hit  # type: ignore[method-assign]
gpu_pool.GpuPrefixCache.release = release  # type: ignore[method-assign]

if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    trace = load_claude_code(claude_code_trace(), max_roots=200)
    sessions = trace.sessions
    STATE["owner"] = [sessions[o].id for o in trace.segment_owner]
    eng.simulate(trace, ReplayConfig("tenure-density-checked", get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=False))
    rows = np.array(STATE["rows"], dtype=float)
    real, kept, present, x = rows.T
    print(f"returns {len(rows)}; real GPU hit: mean {real.mean():.0f} blocks, zero in {np.mean(real == 0):.2f}")
    for name, pred in (("LRU drift, real X", kept), ("present (X = 0)", present)):
        err = pred - real
        print(f"{name}: mean |err| {np.abs(err).mean():.0f} blocks, bias {err.mean():+.0f}; "
              f"exact {np.mean(err == 0):.2f}; both zero {np.mean((pred == 0) & (real == 0)):.2f}; "
              f"says kept but none {np.mean((pred > 0) & (real == 0)):.2f}; "
              f"says none but kept {np.mean((pred == 0) & (real > 0)):.2f}")
