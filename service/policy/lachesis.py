"""Lachesis placement (seed ``001``): segments placed by harness-determined lifetime.

Deterministic path: reasoning (dies at the next turn) and reviewers (read by nobody after they
return) never leave the fast tiers; carried lead-agent context may go to the SSD tier. Predictive
path: live workers ranked at spawn by predicted lifetime, the first ``k`` (shortest) kept off the
SSD tier, ``k`` from the DRAM left free (:func:`~tenure.service.policy.placement.fast_workers`), the
rest may cascade. Every segment's blocks are freed, in every tier, when its boundary closes.

* ``lachesis`` — SSD-eligible segments cascade on DRAM eviction (the seed's design over a
  DRAM-first mechanism);
* ``lachesis-wt`` — SSD-eligible segments are written through, the rest refused, and DRAM
  keeps its own eviction order: exactly what the engine adapter enforces on vLLM 0.32's
  write-through tiering (secondary-tier store admission, file deletion at boundaries);
* ``lachesis-no-ranker`` — the ablation without the predictive path: workers are treated like
  lead context (SSD-eligible), still freed at their return.
"""

from __future__ import annotations

from tenure.service.policy.placement import PlacementPolicy, Route
from tenure.service.policy.segments import SegmentClass

__all__ = ["Lachesis", "LachesisNoRanker", "LachesisWriteThrough"]

_FAST = frozenset({SegmentClass.REASONING, SegmentClass.REVIEWER})


class Lachesis(PlacementPolicy):
    name = "lachesis"
    description = "lifetime-aware: deterministic + predictive path, cascade on eviction"
    lifecycle_aware = True
    ranks_workers = True
    guards_fast_tier = True
    eligible = Route.ON_EVICTION

    def route(self, cls: SegmentClass, fast_worker: bool = False) -> Route:
        if cls in _FAST:
            return Route.FAST_ONLY
        if cls is SegmentClass.WORKER and fast_worker and self.ranks_workers:
            return Route.FAST_ONLY
        return self.eligible


class LachesisWriteThrough(Lachesis):
    name = "lachesis-wt"
    description = "lifetime-aware admission in front of write-through tiering (enforceable)"
    eligible = Route.WRITE_THROUGH
    # vLLM 0.32's primary tier evicts by its own policy: nothing keeps fast-only blocks in DRAM,
    # and an evicted one is gone (there is no cascade on eviction to spill it through).
    guards_fast_tier = False


class LachesisNoRanker(Lachesis):
    name = "lachesis-no-ranker"
    description = "deterministic path only: workers SSD-eligible, freed at return"
    ranks_workers = False
