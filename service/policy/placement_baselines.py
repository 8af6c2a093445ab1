"""Lifecycle-blind placement baselines: what today's engines do with an SSD tier.

* ``write-through`` — vLLM 0.32's ``TieringOffloadingManager``: every block stored to the
  primary (DRAM) tier is cascaded to every secondary tier at once.
* ``dram-first`` — cascade on DRAM eviction (the seed's HBM-first analogue: fill the fast tier,
  spill what it evicts).
* ``frequency-filter`` — NVIDIA Dynamo KVBM's disk filter: write-through, but only blocks used
  at least twice reach the disk tier ("to extend SSD lifespan").
* ``store-threshold`` — vLLM's ``store_threshold`` = 2 on the primary tier (a block is stored to
  DRAM only on its second offer) in front of write-through cascading. vLLM 0.32 refuses the
  setting with ``TieringOffloadingSpec``; the replay models what it would do.
"""

from __future__ import annotations

from tenure.service.policy.placement import PlacementPolicy, Route
from tenure.service.policy.segments import SegmentClass

__all__ = ["DramFirst", "FrequencyFilter", "StoreThreshold", "WriteThrough"]


class WriteThrough(PlacementPolicy):
    name = "write-through"
    description = "vLLM tiering: every DRAM store cascades to the SSD tier"

    def route(self, cls: SegmentClass, fast_worker: bool = False) -> Route:
        return Route.WRITE_THROUGH


class DramFirst(PlacementPolicy):
    name = "dram-first"
    description = "cascade to the SSD tier on DRAM eviction (HBM-first analogue)"

    def route(self, cls: SegmentClass, fast_worker: bool = False) -> Route:
        return Route.ON_EVICTION


class FrequencyFilter(WriteThrough):
    name = "frequency-filter"
    description = "Dynamo KVBM: write-through of blocks used at least twice"
    ssd_min_uses = 2


class StoreThreshold(WriteThrough):
    name = "store-threshold"
    description = "vLLM store_threshold=2 on DRAM, write-through below"
    host_min_offers = 2
