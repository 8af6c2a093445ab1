"""The simulator on the live slice: same engine-level trace, schedule, seed, pool and tier.

The engine's pool and host tier are given in blocks; :func:`profile_for` fits the CPU profile's
memory to exactly that pool, and :func:`host_gib_for` the tier to exactly that many blocks, so
the simulated engine has the live one's capacities block for block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import GIB, HardwareProfile
from tenure.service.replay.model import Trace
from tenure.service.replay.results import RunResult

__all__ = ["host_gib_for", "profile_for", "run_simulated"]


def profile_for(base: HardwareProfile, gpu_blocks: int, block_tokens: int) -> HardwareProfile:
    """``base`` with a KV pool of exactly ``gpu_blocks`` blocks (as ``--num-gpu-blocks``)."""
    pool = gpu_blocks * block_tokens * base.kv_bytes_per_token
    return replace(
        base,
        hbm_bytes_per_gpu=pool + base.weight_bytes,
        gpu_memory_utilization=1.0,
        runtime_reserve_bytes=0.0,
    )


def host_gib_for(host_blocks: int, block_tokens: int, profile: HardwareProfile) -> float:
    """The ``host_gib`` whose tier holds exactly ``host_blocks`` blocks (half a block of slack
    keeps the floor division from losing one to rounding)."""
    return (host_blocks + 0.5) * block_tokens * profile.kv_bytes_per_token / GIB


def run_simulated(
    trace: Trace,
    policy: str,
    profile: HardwareProfile,
    *,
    gpu_blocks: int,
    host_blocks: int,
    arrival_rate: float,
    seed: int,
    policy_params: Mapping[str, float] | None = None,
) -> RunResult:
    hw = profile_for(profile, gpu_blocks, trace.block_tokens)
    config = ReplayConfig(
        policy,
        hw,
        host_gib_for(host_blocks, trace.block_tokens, hw),
        arrival_rate,
        seed,
        policy_params or None,
    )
    return simulate(trace, config)
