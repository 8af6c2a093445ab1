"""Tier placement: which blocks may be written to the endurance-limited SSD tier, and when.

A two-tier offload hierarchy below the GPU: host DRAM (the *fast* tier, vLLM's primary tier,
through which every block passes) and an SSD tier (vLLM's ``fs`` secondary tier). A placement
policy answers, per segment class, one :class:`Route`:

* ``write_through`` — written to the SSD tier as soon as it is stored in DRAM (what vLLM
  0.32's ``TieringOffloadingManager`` does for every block);
* ``on_eviction`` — written to the SSD tier only when DRAM evicts it (cascade on eviction);
* ``fast_only`` — never written to the SSD tier: it lives and dies in the fast tiers.

plus three knobs the baselines need: ``lifecycle_aware`` (the policy frees a segment's blocks in
every tier at its closing boundary; blind policies leave dead blocks to age out, and a blind
cascade-on-eviction policy writes them to the SSD on their way out), ``host_min_offers``
(vLLM's ``store_threshold``: a block enters DRAM only once offered that many times) and
``ssd_min_uses`` (Dynamo KVBM's disk filter: a block is written to the SSD tier only once it
has been used that many times).

The predictive path (:func:`fast_workers`) ranks live workers by predicted lifetime and keeps
the first ``k`` (shortest-lived first) off the SSD tier, ``k`` being as many as fit in the
DRAM left free by everything else that must stay in the fast tiers and by the room DRAM needs
to stage the largest live context (vLLM's primary tier is the gateway for every SSD read: a
DRAM full of pinned workers cannot promote a lead's prefix, which then misses).

Policies are registered by name (lazy import, one small module each); the replay and the
engine adapter create them through :func:`create_placement`.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from tenure.service.policy.segments import SegmentClass

__all__ = [
    "PlacementPolicy",
    "Route",
    "UnknownPlacementError",
    "WorkerSlot",
    "create_placement",
    "fast_workers",
    "placement_class",
    "placement_names",
]


class Route(StrEnum):
    WRITE_THROUGH = "write_through"
    ON_EVICTION = "on_eviction"
    FAST_ONLY = "fast_only"


class PlacementPolicy(ABC):
    """Routes each segment class to the SSD tier now, on DRAM eviction, or never."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    lifecycle_aware: ClassVar[bool] = False
    host_min_offers: ClassVar[int] = 1
    ssd_min_uses: ClassVar[int] = 1
    #: Whether the predictive path ranks workers (``fast_workers`` then matters).
    ranks_workers: ClassVar[bool] = False
    #: Whether DRAM eviction chooses fast-only blocks last (:mod:`placement_guard`); without
    #: it (vLLM 0.32's primary tier runs its own LRU) a fast-only block may simply be evicted.
    guards_fast_tier: ClassVar[bool] = False

    @abstractmethod
    def route(self, cls: SegmentClass, fast_worker: bool = False) -> Route:
        """The route of a segment of class ``cls`` (``fast_worker``: in the predictive set)."""

    def cascades_on_eviction(self) -> bool:
        """Whether any block is written to the SSD tier on its way out of DRAM."""
        return any(
            self.route(cls, fast) is Route.ON_EVICTION
            for cls in SegmentClass
            for fast in (False, True)
        )

    def routes(self) -> dict[str, str]:
        """Every class's route, for reports (workers: outside / inside the fast set)."""
        out = {cls.value: self.route(cls).value for cls in SegmentClass}
        out["worker_fast"] = self.route(SegmentClass.WORKER, True).value
        return out


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """A live worker as the predictive path sees it."""

    key: str
    predicted_lifetime_s: float
    expected_blocks: int
    spawn_order: int


def fast_workers(workers: Iterable[WorkerSlot], free_blocks: int) -> frozenset[str]:
    """The first ``k`` workers by predicted lifetime whose expected blocks fit ``free_blocks``.

    Shortest predicted lifetime first (ties: earlier spawn first); stops at the first worker
    that does not fit, so ``k`` is a prefix of the ranking, as in the seed.
    """
    budget = free_blocks
    chosen: set[str] = set()
    for w in sorted(workers, key=lambda w: (w.predicted_lifetime_s, w.spawn_order)):
        need = max(0, w.expected_blocks)
        if need > budget:
            break
        budget -= need
        chosen.add(w.key)
    return frozenset(chosen)


class UnknownPlacementError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown placement {name!r}; valid: {', '.join(placement_names())}")
        self.name = name


_REGISTRY: dict[str, str] = {
    "write-through": "tenure.service.policy.placement_baselines:WriteThrough",
    "dram-first": "tenure.service.policy.placement_baselines:DramFirst",
    "frequency-filter": "tenure.service.policy.placement_baselines:FrequencyFilter",
    "store-threshold": "tenure.service.policy.placement_baselines:StoreThreshold",
    "lachesis": "tenure.service.policy.lachesis:Lachesis",
    "lachesis-no-ranker": "tenure.service.policy.lachesis:LachesisNoRanker",
    "lachesis-wt": "tenure.service.policy.lachesis:LachesisWriteThrough",
}


def placement_names() -> list[str]:
    return sorted(_REGISTRY)


def register_placement(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:ClassName"``) under ``name``; idempotent."""
    current = _REGISTRY.get(name)
    if current is not None and current != target:
        raise ValueError(f"placement {name!r} is already registered as {current}")
    _REGISTRY[name] = target


def placement_class(name: str) -> type[PlacementPolicy]:
    target = _REGISTRY.get(name)
    if target is None:
        raise UnknownPlacementError(name)
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(cls, type) and issubclass(cls, PlacementPolicy)):
        raise TypeError(f"{target} is not a PlacementPolicy")
    return cls


def create_placement(name: str) -> PlacementPolicy:
    return placement_class(name)()
