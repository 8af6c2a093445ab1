"""The ``tenure-fs`` tier's registered type name and the metric names it exports."""

from __future__ import annotations

from tenure.engine_adapter.segment_book import UNTAGGED
from tenure.service.policy.segments import SegmentClass

__all__ = ["CLASS_LABELS", "METRICS", "TIER_TYPE"]

TIER_TYPE = "tenure-fs"
#: Every value the ``segment_class`` label takes (bounded: client input never names a label).
CLASS_LABELS = (*(c.value for c in SegmentClass), UNTAGGED)


class METRICS:
    """Metric names (vLLM adds ``_total`` to counters when exporting)."""

    WRITE_BYTES = "vllm:kv_offload_segment_write_bytes"  # {tier, segment_class}
    KEPT_OFF_SSD_BYTES = "vllm:kv_offload_segment_kept_off_ssd_bytes"  # {segment_class}
    DELETED_BYTES = "vllm:kv_offload_segment_deleted_bytes"  # {segment_class}
    ERRORS = "vllm:kv_offload_segment_errors"  # {kind}
    SSD_USED_BYTES = "vllm:kv_offload_ssd_used_bytes"
    SSD_CAPACITY_BYTES = "vllm:kv_offload_ssd_capacity_bytes"
    SSD_WRITE_RATE = "vllm:kv_offload_ssd_write_rate_bytes_per_second"
    SSD_DEVICE_YEARS = "vllm:kv_offload_ssd_projected_device_years"
    SSD_WARRANTY_YEARS = "vllm:kv_offload_ssd_warranty_years"
