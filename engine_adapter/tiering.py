"""``tenure-fs``: vLLM's filesystem (SSD) secondary tier with lifetime-aware store admission.

vLLM 0.32's ``TieringOffloadingManager`` cascades every block stored in the primary (DRAM) tier
to every secondary tier (``complete_store`` -> ``submit_store``); a secondary tier decides what
it actually writes. :class:`TenureFsTier` is the stock ``fs`` tier
(:class:`~vllm.v1.kv_offload.tiering.fs.manager.FileSystemTierManager`, one file per block)
with three additions, all through the ``SecondaryTierManager`` interface (no fork):

* **admission** — each offered block is classified by the segment its tokens fall in (the
  request's ``kv_transfer_params.tenure``, :mod:`tenure.service.wire.segments`; the position of a
  key is the scheduler's ``ReqContext.get_offload_key_position``) and written only if the core
  placement policy routes its class to the SSD tier: reasoning and reviewers never are, nor are
  the workers the predictive path keeps in the fast tier;
* **deletion** — when a segment's boundary closes (reasoning not carried into the next turn, an
  explicit ``close``, a worker's return, a lead's last turn) the files only it used are deleted;
* **accounting** — bytes written per tier and segment class: DRAM bytes are the blocks the
  primary tier stored (every one of them is offered here), SSD bytes are measured on the
  filesystem (the sizes of the files a store job made appear), plus SSD bytes in use, the write
  rate and the projected device-years at that rate against the configured endurance. They are
  exported as vLLM metrics (``vllm:kv_offload_segment_*``, ``vllm:kv_offload_ssd_*``) and by
  :meth:`TenureFsTier.placement_report`.

Configure it as a secondary tier (the plugin registers the type, no ``module_path`` needed)::

    "secondary_tiers": [{"type": "tenure-fs", "root_dir": "/mnt/nvme/kv",
                         "placement": "lachesis-wt",
                         "ssd_capacity_bytes": 3.84e12, "ssd_dwpd": 1, "ssd_warranty_years": 5}]

``ssd_capacity_bytes`` feeds the projection and the capacity gauge; it is not a limit (the
``fs`` tier has no eviction: deleting closed segments is what bounds its size here).

With a push address (``"push_addr"`` in the tier's entry, or env ``TENURE_PUSH_ADDR``) the
tier also reports the same accounting to the sidecar over its engine's one push connection
(:func:`~tenure.engine_adapter.push_client.engine_push_client`, shared with Tenure's manager when
the engine has one; :mod:`tenure.engine_adapter.placement_push`, every ``push_interval_s``, default
1 s), under ``engine_id`` (env ``TENURE_ENGINE_ID``, the id ``TENURE_PUSH_ENGINE_IDS`` lists at the
sidecar; default: host, pid and a random suffix); the sidecar exports it as
``tenure_placement_*`` metrics. ``"push_addr": ""`` turns it off.

Only placements that never cascade on eviction are accepted (vLLM 0.32 tells a secondary tier
nothing about primary evictions): ``write-through`` (vLLM's own behaviour, with accounting) and
``lachesis-wt`` (the default).
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from vllm.v1.kv_offload.base import (
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    get_offload_group_idx,
)
from vllm.v1.kv_offload.tiering.base import JobResult, TransferJob
from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

from tenure.engine_adapter.placement_push import PlacementTotals
from tenure.engine_adapter.push_client import PushClient, engine_push_client
from tenure.engine_adapter.segment_book import UNTAGGED, SegmentBook
from tenure.engine_adapter.settings import adapter_env
from tenure.engine_adapter.tiering_names import METRICS, TIER_TYPE
from tenure.engine_adapter.tiering_stats import metric_definitions, placement_totals
from tenure.service.policy.endurance import Endurance, WriteRateMeter
from tenure.service.policy.placement import UnknownPlacementError, create_placement

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import OffloadingSpec
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector

__all__ = ["TenureFsTier"]

log = logging.getLogger("vllm.tenure")


def _number(config: dict[str, Any], key: str, default: float | None) -> float | None:
    value = config.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"secondary tier {TIER_TYPE!r}: {key} must be a positive number")
    return float(value)


class TenureFsTier(FileSystemTierManager):
    """The ``fs`` tier with segment-aware admission, deletion at boundaries and wear accounting."""

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        n_read_threads: int = 16,
        n_write_threads: int = 16,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        placement: str = "lachesis-wt",
        push_addr: str | None = None,
        push_interval_s: float = 1.0,
        engine_id: str | None = None,
        **endurance: Any,
    ) -> None:
        try:
            policy = create_placement(placement)
        except UnknownPlacementError as exc:
            raise ValueError(f"secondary tier {TIER_TYPE!r}: {exc}") from None
        if policy.cascades_on_eviction() or policy.host_min_offers > 1 or policy.ssd_min_uses > 1:
            raise ValueError(
                f"secondary tier {TIER_TYPE!r}: placement {placement!r} needs a hook vLLM's "
                "tiering does not have (cascade on eviction / use counts); "
                "use 'lachesis-wt' or 'write-through'"
            )
        unknown = set(endurance) - {
            "ssd_capacity_bytes",
            "ssd_dwpd",
            "ssd_warranty_years",
            "ssd_rated_bytes_written",
            "write_rate_half_life_s",
        }
        if unknown:
            raise ValueError(f"secondary tier {TIER_TYPE!r}: unknown option(s) {sorted(unknown)}")
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            root_dir,
            n_read_threads=n_read_threads,
            n_write_threads=n_write_threads,
            enable_kv_events=enable_kv_events,
            locality=locality,
            backpressure_detector=backpressure_detector,
        )
        self.placement = policy
        self._chunk_tokens = [
            int(t) * int(offloading_spec.blocks_per_chunk) for t in offloading_spec.tokens_per_block
        ]
        # The predictive path's budget: the primary tier's capacity, in blocks.
        self.book = SegmentBook(
            policy, int(getattr(offloading_spec, "num_chunks", 0)), self._chunk_tokens[0]
        )
        self.capacity_bytes = _number(endurance, "ssd_capacity_bytes", None)
        rated = _number(endurance, "ssd_rated_bytes_written", None)
        dwpd = _number(endurance, "ssd_dwpd", None)
        warranty = _number(endurance, "ssd_warranty_years", 5.0)
        assert warranty is not None
        self.endurance: Endurance | None = None
        if rated is not None:
            self.endurance = Endurance(rated, warranty)
        elif dwpd is not None and self.capacity_bytes is not None:
            self.endurance = Endurance.from_dwpd(dwpd, self.capacity_bytes, warranty)
        half_life = _number(endurance, "write_rate_half_life_s", 3600.0)
        assert half_life is not None
        self.meter = WriteRateMeter(half_life)
        #: Cumulative counters: (metric, label tuple) -> value; ``_reported`` what get_stats
        #: has handed to vLLM already.
        self.totals: Counter[tuple[str, tuple[str, ...]]] = Counter()
        self._reported: Counter[tuple[str, tuple[str, ...]]] = Counter()
        self.ssd_used_bytes = 0
        self._file_bytes: dict[OffloadKey, int] = {}
        self._inflight: dict[int, list[tuple[OffloadKey, str, bool]]] = {}
        self._inflight_keys: Counter[OffloadKey] = Counter()
        self._doomed: set[OffloadKey] = set()
        self._done_local: list[JobResult] = []
        self.deleted_files = 0
        self.pusher: PushClient | None = None
        env = adapter_env()
        addr = (env.push_addr or "") if push_addr is None else push_addr
        if addr:
            interval = _number({"push_interval_s": push_interval_s}, "push_interval_s", 1.0)
            assert interval is not None
            ident = engine_id or env.engine_id
            self.pusher = engine_push_client(
                offloading_spec,
                str(addr),
                engine_id=ident or "",
                adapter_id=ident,
            )
            self.pusher.report_placement(self.placement_totals, interval)

    # --- vLLM metric definitions -----------------------------------------------------------

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        return metric_definitions()

    # --- request lifecycle -------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        ctx = super().on_new_request(req_context)
        self._delete(self.book.begin(req_context.req_id, req_context.kv_transfer_params))
        return ctx

    def on_request_finished(self, req_context: ReqContext) -> None:
        super().on_request_finished(req_context)
        self._delete(self.book.finish(req_context.req_id))

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        for key in keys:
            lo, hi = self._tokens(key, req_context)
            self.book.touch(req_context.req_id, key, lo, hi)

    # --- stores ---------------------------------------------------------------------------

    def _tokens(self, key: OffloadKey, req_context: ReqContext) -> tuple[int | None, int | None]:
        end = req_context.get_offload_key_position(key)
        if end is None:
            return None, None
        group = get_offload_group_idx(key)
        span = self._chunk_tokens[group] if group < len(self._chunk_tokens) else 0
        return max(0, end - span), end

    def submit_store(self, job_metadata: TransferJob) -> None:
        req_context = job_metadata.req_context
        chunk_ids = np.asarray(job_metadata.chunk_ids)
        all_keys = list(job_metadata.keys)
        keep: list[int] = []
        block = self.block_size_bytes
        for i, key in enumerate(all_keys):
            lo, hi = self._tokens(key, req_context)
            label, _row = self.book.classify(req_context.req_id, lo, hi)
            self.totals[(METRICS.WRITE_BYTES, ("dram", label))] += block
            if self.book.admit(req_context.req_id, key, lo, hi):
                keep.append(i)
            else:
                self.totals[(METRICS.KEPT_OFF_SSD_BYTES, (label,))] += block
        if not keep:
            # Nothing to write: the job is done (the manager still needs its completion to
            # unpin the primary chunks).
            self._done_local.append(
                JobResult(job_metadata.job_id, True, transfer_time=0.0, transfer_bytes=0)
            )
            return
        keys = [all_keys[i] for i in keep]
        pending: list[tuple[OffloadKey, str, bool]] = []
        for key in keys:
            path = self.file_mapper.get_file_name(key)
            pending.append((key, path, os.path.exists(path)))
            self._inflight_keys[key] += 1
        self._inflight[job_metadata.job_id] = pending
        super().submit_store(
            TransferJob(
                job_id=job_metadata.job_id,
                keys=keys,
                chunk_ids=chunk_ids[keep],
                is_promotion=False,
                req_context=req_context,
                submit_time=job_metadata.submit_time,
            )
        )

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = list(super().get_finished_jobs())
        results.extend(self._done_local)
        self._done_local = []
        now = time.monotonic()
        for result in results:
            pending = self._inflight.pop(result.job_id, None)
            if pending is None:
                continue  # a load (promotion) job
            for key, path, existed in pending:
                self._inflight_keys[key] -= 1
                if self._inflight_keys[key] <= 0:
                    del self._inflight_keys[key]
                if not existed and key not in self._file_bytes:
                    size = _file_size(path)
                    if size:
                        self._file_bytes[key] = size
                        self.ssd_used_bytes += size
                        label = self.book.file_class.get(key, UNTAGGED)
                        self.totals[(METRICS.WRITE_BYTES, ("ssd", label))] += size
                        self.meter.observe(now, size)
                        self.book.written(key)
                if key in self._doomed and key not in self._inflight_keys:
                    self._doomed.discard(key)
                    if not self.book.owns(key):  # no segment took it up again meanwhile
                        self._delete([key])
        return results

    # --- deletion ---------------------------------------------------------------------------

    def _delete(self, keys: Iterable[Any]) -> None:
        for key in keys:
            if key in self._inflight_keys:
                self._doomed.add(key)  # a store is still writing it: delete when it lands
                continue
            size = self._file_bytes.get(key)
            if size is None:
                # Never written by this tier (or the file was there before it): not ours.
                self.book.deleted(key, False)
                continue
            path = self.file_mapper.get_file_name(key)
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self.totals[(METRICS.ERRORS, ("delete",))] += 1
                log.warning("tenure: cannot delete %s: %s", path, exc)
                continue
            del self._file_bytes[key]
            self.deleted_files += 1
            label = self.book.deleted(key, True)
            self.ssd_used_bytes -= size
            self.totals[(METRICS.DELETED_BYTES, (label,))] += size

    # --- reports ----------------------------------------------------------------------------

    def projected_device_years(self, now: float | None = None) -> float | None:
        rate = self.meter.rate(time.monotonic() if now is None else now)
        if self.endurance is None or rate <= 0:
            return None
        return self.endurance.device_years(rate)

    def placement_report(self) -> dict[str, Any]:
        """Bytes per tier and class, SSD usage, write rate and projected lifetime."""
        by: dict[str, dict[str, int]] = {}
        for (metric, labels), value in self.totals.items():
            by.setdefault(metric, {})[":".join(labels)] = value
        years = self.projected_device_years()
        for kind, n in self.book.errors.items():
            by.setdefault(METRICS.ERRORS, {})[kind] = n
        return {
            "placement": self.placement.name,
            "write_bytes": by.get(METRICS.WRITE_BYTES, {}),
            "kept_off_ssd_bytes": by.get(METRICS.KEPT_OFF_SSD_BYTES, {}),
            "deleted_bytes": by.get(METRICS.DELETED_BYTES, {}),
            "errors": by.get(METRICS.ERRORS, {}),
            "ssd_used_bytes": self.ssd_used_bytes,
            "ssd_files": len(self._file_bytes),
            "ssd_write_bytes_total": self.meter.total_bytes,
            "ssd_write_rate_bytes_per_s": self.meter.rate(time.monotonic()),
            "projected_device_years": years,
            "warranty_years": None if self.endurance is None else self.endurance.warranty_years,
            "open_segments": self.book.open_segments(),
            "files_referenced": self.book.files_tracked(),
        }

    @property
    def ssd_files(self) -> int:
        return len(self._file_bytes)

    def placement_totals(self) -> PlacementTotals:
        """A copy of the counters and the gauges, safe to take from the push thread."""
        return placement_totals(self)

    def shutdown(self) -> None:
        if self.pusher is not None:
            self.pusher.report_placement(None)
            self.pusher.stop()
            self.pusher = None
        super().shutdown()

    def get_stats(self) -> OffloadingConnectorStats | None:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )

        stats = OffloadingConnectorStats()
        for kind, n in self.book.errors.items():
            self.totals[(METRICS.ERRORS, (kind,))] = n
        for key, value in self.totals.items():
            delta = value - self._reported[key]
            if delta:
                stats.increase_counter(key[0], delta, key[1])
                self._reported[key] = value
        stats.set_gauge(METRICS.SSD_USED_BYTES, self.ssd_used_bytes)
        stats.set_gauge(METRICS.SSD_CAPACITY_BYTES, self.capacity_bytes or 0)
        stats.set_gauge(METRICS.SSD_WRITE_RATE, self.meter.rate(time.monotonic()))
        years = self.projected_device_years()
        stats.set_gauge(METRICS.SSD_DEVICE_YEARS, -1.0 if years is None else years)
        stats.set_gauge(
            METRICS.SSD_WARRANTY_YEARS,
            0.0 if self.endurance is None else self.endurance.warranty_years,
        )
        return stats


def _file_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
