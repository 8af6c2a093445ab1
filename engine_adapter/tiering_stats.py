"""The ``tenure-fs`` tier's vLLM metric definitions and the copy of its totals it pushes.

Kept beside :mod:`tenure.engine_adapter.tiering` so the tier module stays one job (admission,
deletion, accounting); these two read its state only.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Protocol

from vllm.v1.kv_offload.base import (
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
)

from tenure.engine_adapter.placement_push import PlacementTotals
from tenure.engine_adapter.tiering_names import METRICS
from tenure.service.policy.endurance import Endurance, WriteRateMeter
from tenure.service.policy.placement import PlacementPolicy

__all__ = ["TierState", "metric_definitions", "placement_totals"]


def metric_definitions() -> dict[str, OffloadingMetricMetadata]:
    """What the tier exports through vLLM's offloading metrics."""
    return {
        METRICS.WRITE_BYTES: OffloadingCounterMetadata(
            documentation="KV bytes written per offload tier (dram, ssd) and segment class; "
            "ssd bytes as measured on the filesystem.",
            labelnames=("tier", "segment_class"),
        ),
        METRICS.KEPT_OFF_SSD_BYTES: OffloadingCounterMetadata(
            documentation="KV bytes stored in DRAM that placement kept off the SSD tier.",
            labelnames=("segment_class",),
        ),
        METRICS.DELETED_BYTES: OffloadingCounterMetadata(
            documentation="SSD-tier bytes deleted because their segment closed.",
            labelnames=("segment_class",),
        ),
        METRICS.ERRORS: OffloadingCounterMetadata(
            documentation="Malformed segment tags or impossible boundaries (request served "
            "without segments), by kind.",
            labelnames=("kind",),
        ),
        METRICS.SSD_USED_BYTES: OffloadingGaugeMetadata(
            documentation="Bytes of KV files this tier wrote and has not deleted."
        ),
        METRICS.SSD_CAPACITY_BYTES: OffloadingGaugeMetadata(
            documentation="Configured SSD tier capacity in bytes (0: not configured)."
        ),
        METRICS.SSD_WRITE_RATE: OffloadingGaugeMetadata(
            documentation="SSD write rate, bytes/s (exponentially weighted)."
        ),
        METRICS.SSD_DEVICE_YEARS: OffloadingGaugeMetadata(
            documentation="Projected SSD lifetime in years at the current write rate, 24x7 "
            "(rated endurance over write rate; -1: endurance not configured or no writes)."
        ),
        METRICS.SSD_WARRANTY_YEARS: OffloadingGaugeMetadata(
            documentation="The SSD's warranty period in years (0: not configured)."
        ),
    }


class TierState(Protocol):
    """What :func:`placement_totals` reads of a
    :class:`~tenure.engine_adapter.tiering.TenureFsTier`."""

    totals: Counter[tuple[str, tuple[str, ...]]]
    placement: PlacementPolicy
    deleted_files: int
    ssd_used_bytes: int
    capacity_bytes: float | None
    endurance: Endurance | None
    meter: WriteRateMeter

    @property
    def ssd_files(self) -> int: ...

    def projected_device_years(self, now: float | None = None) -> float | None: ...


def placement_totals(tier: TierState) -> PlacementTotals:
    """A copy of ``tier``'s cumulative counters and its gauges, safe to take from another
    thread (the push thread): ``dict.copy`` of the counters is one step under the GIL."""
    totals = dict.copy(tier.totals)
    by_metric: dict[str, dict[tuple[str, ...], int]] = {}
    for (metric, labels), value in totals.items():
        by_metric.setdefault(metric, {})[labels] = value
    writes = {
        (labels[0], labels[1]): v
        for labels, v in by_metric.get(METRICS.WRITE_BYTES, {}).items()
        if len(labels) == 2
    }
    years = tier.projected_device_years()
    return PlacementTotals(
        placement=tier.placement.name,
        write_bytes=writes,
        kept_off_ssd_bytes={
            labels[0]: v for labels, v in by_metric.get(METRICS.KEPT_OFF_SSD_BYTES, {}).items()
        },
        deleted_bytes={
            labels[0]: v for labels, v in by_metric.get(METRICS.DELETED_BYTES, {}).items()
        },
        deleted_files=tier.deleted_files,
        ssd_used_bytes=tier.ssd_used_bytes,
        ssd_files=tier.ssd_files,
        ssd_capacity_bytes=int(tier.capacity_bytes or 0),
        ssd_warranty_years=0.0 if tier.endurance is None else tier.endurance.warranty_years,
        ssd_write_rate_bytes_per_s=tier.meter.rate(time.monotonic()),
        projected_device_years=years,
    )
