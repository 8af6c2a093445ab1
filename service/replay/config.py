"""What one replay run is configured with: the engine, the host tier, and an optional SSD tier."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tenure.service.policy.placement import create_placement
from tenure.service.replay.hardware import HardwareProfile, SsdProfile

__all__ = ["ENDS", "ReplayConfig", "TieringConfig", "WorkloadNotes"]

#: The ways a replay learns of a session's end (:attr:`ReplayConfig.ends`).
ENDS = ("declared", "inferred", "none")


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    policy: str
    hardware: HardwareProfile
    host_gib: float
    arrival_rate: float  # root sessions per second (Poisson)
    seed: int
    policy_params: Mapping[str, float] | None = None
    #: An SSD tier below the host tier and its placement (``None``: the host tier only).
    tiering: TieringConfig | None = None
    #: Record the run's accesses and compute the bound on the prefill work its host tier could
    #: have saved (:mod:`tenure.service.replay.bound`; host tier only, ignored with ``tiering``).
    bound: bool = False
    #: With ``bound``: also the two diagnostics of ``bound.prefill_bound`` (``hold_across_gpu``,
    #: ``vllm_offers``; ``RunResult.bound_held_work`` and ``bound_vllm_work``).
    bound_held: bool = False
    #: How a session's end is known: ``declared`` (each session's final turn declares
    #: ``last_turn``, the trace format's rule), ``inferred`` (nothing is declared; a turn the
    #: trace marks ``likely_end``, the sidecar's inference for one-shot harness runs and
    #: sub-agents, is hinted as one: evicted first, not reclaimed) or ``none`` (nothing is
    #: declared or inferred: a harness that sends no end, before issue 24).
    ends: str = "declared"

    def __post_init__(self) -> None:
        if self.ends not in ENDS:
            raise ValueError(f"ends must be one of {', '.join(ENDS)}")


@dataclass(frozen=True)
class WorkloadNotes:
    """What placement needs that the replay trace model does not carry."""

    #: Session id -> estimated reasoning tokens per turn.
    reasoning_tokens: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Worker session id -> predicted lifetime (seconds) from the ranker at spawn.
    predicted_lifetime_s: Mapping[str, float] = field(default_factory=dict)
    #: Sub-agent session id -> ``worker`` or ``reviewer`` (default ``worker``).
    roles: Mapping[str, str] = field(default_factory=dict)
    #: Name of the ranker the predictions came from (for reports).
    ranker: str = "none"


@dataclass(frozen=True)
class TieringConfig:
    placement: str
    ssd: SsdProfile
    notes: WorkloadNotes = field(default_factory=WorkloadNotes)
    #: SSD tier capacity (default: the whole device).
    ssd_bytes: float | None = None
    #: A fast-only worker block evicted from DRAM: ``spill`` it to the SSD tier (counted) or
    #: ``drop`` it (a later turn recomputes it).
    fast_eviction: str = "spill"

    def __post_init__(self) -> None:
        if self.fast_eviction not in ("spill", "drop"):
            raise ValueError("fast_eviction must be 'spill' or 'drop'")
        create_placement(self.placement)  # fail early on an unknown name
