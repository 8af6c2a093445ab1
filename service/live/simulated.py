"""The simulator on the live slice: same engine-level trace, schedule, seed, pool and tier.

The engine's pool and host tier are given in blocks; :func:`profile_for` fits the CPU profile's
memory to exactly that pool, and :func:`host_gib_for` the tier to exactly that many blocks, so
the simulated engine has the live one's capacities block for block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate, simulate_paced
from tenure.service.replay.hardware import GIB, HardwareProfile
from tenure.service.replay.model import Trace
from tenure.service.replay.pacing import DispatchPlan
from tenure.service.replay.results import RunResult

__all__ = ["host_gib_for", "profile_for", "run_paced", "run_simulated"]


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


def _config(
    trace: Trace,
    policy: str,
    profile: HardwareProfile,
    gpu_blocks: int,
    host_blocks: int,
    arrival_rate: float,
    seed: int,
    policy_params: Mapping[str, float] | None,
) -> ReplayConfig:
    hw = profile_for(profile, gpu_blocks, trace.block_tokens)
    return ReplayConfig(
        policy,
        hw,
        host_gib_for(host_blocks, trace.block_tokens, hw),
        arrival_rate,
        seed,
        policy_params or None,
    )


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
    """One arm run freely: each call sent when the slice's closed loop has it due."""
    config = _config(
        trace, policy, profile, gpu_blocks, host_blocks, arrival_rate, seed, policy_params
    )
    return simulate(trace, config)


def run_paced(
    trace: Trace,
    policies: Sequence[str],
    profile: HardwareProfile,
    plan: DispatchPlan,
    *,
    gpu_blocks: int,
    host_blocks: int,
    arrival_rate: float,
    seed: int,
    policy_params: Mapping[str, Mapping[str, float]] | None = None,
) -> list[RunResult]:
    """The arms held to ``plan`` as the live ones are: one policy is an arm played in turn,
    several are arms played side by side under one gate (:func:`simulate_paced`)."""
    params = policy_params or {}
    configs = [
        _config(trace, p, profile, gpu_blocks, host_blocks, arrival_rate, seed, params.get(p))
        for p in policies
    ]
    return simulate_paced(trace, configs, plan)
