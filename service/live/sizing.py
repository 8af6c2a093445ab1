"""The pressure rule that sizes the live engine's KV pool and host tier, before any arm runs.

The replay's acceptance point (``results/ladder``: 200 Claude Code sessions at 0.001 sessions/s,
32 GiB host tier, an H100's 49.5 GiB KV pool) puts the p95 live working set at 5.1x the host
tier and the pool at 1.55x the tier. The live slice is put under the same kind of pressure by
rule, fixed before looking at any result:

* the p95 live working set of the slice (the time-weighted 95th percentile of the summed
  contexts of every session between its first call and its last; policy-independent) is
  measured by replaying the schedule once with no host tier and an unbounded pool;
* host tier = p95 live working set / 4 (so the working set is >= 3x the tier, with margin);
* KV pool = 1.5 x the host tier (the acceptance point's ratio), and never less than what the
  largest call of the slice plus the batch's other calls need to run (vLLM must admit it).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from tenure.service.live.simulated import run_simulated
from tenure.service.replay.hardware import GIB, HardwareProfile
from tenure.service.replay.model import Trace

__all__ = ["GPU_OVER_HOST", "WS_OVER_HOST", "Sizing", "size_for"]

WS_OVER_HOST = 4.0
GPU_OVER_HOST = 1.5


@dataclass(frozen=True, slots=True)
class Sizing:
    p95_live_working_set_blocks: int
    host_blocks: int
    gpu_blocks: int
    largest_call_blocks: int
    block_tokens: int

    @property
    def ws_over_host(self) -> float:
        return self.p95_live_working_set_blocks / self.host_blocks

    @property
    def gpu_over_host(self) -> float:
        return self.gpu_blocks / self.host_blocks

    def describe(self) -> str:
        return (
            f"p95 live working set {self.p95_live_working_set_blocks} blocks of "
            f"{self.block_tokens} tokens -> host tier {self.host_blocks} blocks "
            f"({self.ws_over_host:.1f}x), KV pool {self.gpu_blocks} blocks "
            f"({self.gpu_over_host:.2f}x the tier)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "ws_over_host": self.ws_over_host,
            "gpu_over_host": self.gpu_over_host,
            "rule": f"host = p95 live working set / {WS_OVER_HOST:g}; pool = "
            f"{GPU_OVER_HOST:g} x host (at least the largest call + 1 block per other "
            "running call)",
        }


def size_for(
    trace: Trace,
    profile: HardwareProfile,
    *,
    arrival_rate: float,
    seed: int,
    max_num_seqs: int,
) -> Sizing:
    largest = max(t.blocks for s in trace.sessions for t in s.turns)
    # No pressure at all: a pool as large as the whole slice, no host tier.
    total = sum(t.blocks + 2 for s in trace.sessions for t in s.turns)
    run = run_simulated(
        trace,
        "notier",
        profile,
        gpu_blocks=max(total, largest + 2),
        host_blocks=0,
        arrival_rate=arrival_rate,
        seed=seed,
    )
    block_bytes = trace.block_tokens * profile.kv_bytes_per_token
    ws = round(run.p95_live_working_set_gib * GIB / block_bytes)
    host = max(1, round(ws / WS_OVER_HOST))
    floor = largest + 2 + (max_num_seqs - 1)
    gpu = max(math.ceil(GPU_OVER_HOST * host), floor)
    return Sizing(ws, host, gpu, largest, trace.block_tokens)
