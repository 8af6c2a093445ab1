"""Prometheus metrics of the sidecar, on an explicitly passed ``CollectorRegistry``.

Every name has the ``tenure_`` prefix and its unit in the name. The app factory builds one
:class:`Metrics` per app (tests build as many as they like; nothing is global), and ``/metrics``
renders that registry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tenure.service.metrics_retention import RetentionMetrics
from tenure.service.policy.types import EvictionClass
from tenure.service.wire.push import (
    PLACEMENT_CLASSES,
    PLACEMENT_TIERS,
    PlacementReport,
    ResidencyReport,
)

__all__ = ["OTHER", "LabelBudget", "Metrics"]

#: The label value every value past a label's budget shares.
OTHER = "other"
_LABEL_TEXT = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_EVICTION_CLASSES = frozenset(c.value for c in EvictionClass)
_PLACEMENT_TIERS = frozenset(PLACEMENT_TIERS)
_PLACEMENT_CLASSES = frozenset(PLACEMENT_CLASSES)


class LabelBudget:
    """At most ``limit`` distinct values of one label: values must look like names
    (``[A-Za-z0-9._:-]``, at most 64 characters) and newcomers past the budget share
    :data:`OTHER`. Every label fed from outside the process (a client, an adapter) goes
    through one, so no sender can grow ``/metrics`` without bound."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) >= self._limit or not _LABEL_TEXT.match(value):
            return OTHER
        self._seen.add(value)
        return value


# Sidecar overhead is sub-millisecond when healthy; the upper buckets catch Redis trouble.
_LATENCY_BUCKETS = (
    0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.5,
)  # fmt: skip
_GAP_BUCKETS = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 1800, 3600, 7200)
_LAG_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


class Metrics:
    def __init__(self, registry: CollectorRegistry, *, max_adapters: int = 64) -> None:
        self.registry = registry
        r = registry
        self.adapter_label = LabelBudget(max_adapters)
        self._tier_label = LabelBudget(8)
        self._reason_label = LabelBudget(64)
        self.requests = Counter(
            "tenure_requests", "Requests served, by route and status", ["route", "status"],
            registry=r,
        )  # fmt: skip
        self.sidecar_latency = Histogram(
            "tenure_sidecar_latency_seconds",
            "Time spent in the sidecar per request, excluding the upstream",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "tenure_upstream_errors", "Upstream failures by kind", ["kind"], registry=r
        )
        self.client_disconnects = Counter(
            "tenure_client_disconnects",
            "Streams cut by the client (upstream request cancelled)",
            registry=r,
        )
        self.sessions = Gauge(
            "tenure_sessions", "Live sessions by lifecycle state", ["state"], registry=r
        )
        self.sessions_inferred = Counter(
            "tenure_sessions_inferred",
            "Requests whose session was inferred from message-prefix hashes",
            registry=r,
        )
        self.decisions = Counter(
            "tenure_decisions", "Session decisions published, by kind and reason",
            ["kind", "reason"], registry=r,
        )  # fmt: skip
        self.redis_errors = Counter(
            "tenure_redis_errors", "Failed Redis operations", ["op"], registry=r
        )
        self.redis_wait_short = Counter(
            "tenure_redis_wait_short",
            "Hot-path writes fewer replicas acknowledged than TENURE_REDIS_WAIT_REPLICAS in time",
            registry=r,
        )
        self.fail_open = Counter(
            "tenure_fail_open",
            "Proxied requests forwarded without lifecycle state because Redis was unavailable",
            registry=r,
        )
        self.failed_turns = Counter(
            "tenure_failed_turns",
            "Tracked requests the upstream did not take (an error answer, unreachable, the "
            "client gone), by whether their turn was taken back in Redis (no: another turn of "
            "the session had started)",
            ["taken_back"], registry=r,
        )  # fmt: skip
        self.early_forwards = Counter(
            "tenure_early_forwards",
            "Requests forwarded before Redis counted their turn, by how Redis's count compared "
            "with the forwarded turn number (confirmed, wrong_turn, state_unavailable)",
            ["outcome"], registry=r,
        )  # fmt: skip
        self.hint_rejections = Counter(
            "tenure_hint_rejections", "Requests refused for malformed hints", ["field"],
            registry=r,
        )  # fmt: skip
        self.segment_splits = Counter(
            "tenure_segment_splits",
            "Tracked turns split into segments, by how the previous response came back "
            "(first, carried, stripped, plain, rewritten, unknown)",
            ["verdict"], registry=r,
        )  # fmt: skip
        self.segment_prompt_counts = Counter(
            "tenure_segment_prompt_counts",
            "Prompt lengths taken for a reasoning segment declared before generation, by how "
            "(exact: the engine's /tokenize; lower_bound: from the previous turn; none)",
            ["outcome"], registry=r,
        )  # fmt: skip
        # Labels come from tenure.service.api.hints.dialects.DIALECT_FIELDS only (a fixed set).
        self.dialect_fields = Counter(
            "tenure_dialect_fields",
            "Hint fields of other stacks' dialects: used, overridden by a higher source, "
            "ignored (malformed) or unknown",
            ["dialect", "field", "outcome"],
            registry=r,
        )
        # Labels come from tenure.service.harness.profiles.HARNESS_FIELDS only (a fixed set).
        self.harness_fields = Counter(
            "tenure_harness_fields",
            "Harness fields read from Claude Code, Codex and other harnesses' own traffic: "
            "used, malformed (ignored) or unchecked (a version outside the trusted range)",
            ["harness", "field", "outcome"],
            registry=r,
        )
        self.gap_observed = Histogram(
            "tenure_gap_observed_seconds", "Observed idle gaps between turns, by stop class",
            ["stop_class"], buckets=_GAP_BUCKETS, registry=r,
        )  # fmt: skip
        self.gap_predicted = Histogram(
            "tenure_gap_predicted_seconds", "Predicted (or declared) gaps, by stop class",
            ["stop_class"], buckets=_GAP_BUCKETS, registry=r,
        )  # fmt: skip
        self.gap_prediction_error = Histogram(
            "tenure_gap_prediction_error_seconds",
            "Absolute error of the expected gap against the observed one",
            ["stop_class"], buckets=_GAP_BUCKETS, registry=r,
        )  # fmt: skip
        self.lambda_crit = Gauge(
            "tenure_lambda_crit_per_second", "Load above which host DRAM is scarce", registry=r
        )
        # Push channel.
        self.push_adapters = Gauge(
            "tenure_push_adapters", "Adapters heard from recently", registry=r
        )
        self.push_messages = Counter(
            "tenure_push_messages", "Push-channel messages, by direction and kind",
            ["direction", "kind"], registry=r,
        )  # fmt: skip
        self.push_lag = Histogram(
            "tenure_push_lag_seconds",
            "Delay from a decision being issued to it being sent to adapters",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.push_resyncs = Counter(
            "tenure_push_resyncs", "Snapshots sent on adapter resync requests", registry=r
        )
        self.push_seq_behind = Gauge(
            "tenure_push_seq_behind", "Decisions an adapter has not applied yet, by adapter",
            ["adapter"], registry=r,
        )  # fmt: skip
        self.push_refused_peers = Counter(
            "tenure_push_refused_peers",
            "Push-channel messages ignored because the adapter limit was reached",
            registry=r,
        )
        self.push_bad_frames = Counter(
            "tenure_push_bad_frames", "Undecodable frames received on the push channel",
            registry=r,
        )  # fmt: skip
        # The adapters' residency counters, summed over adapters.
        self.adapter_stores = Counter(
            "tenure_adapter_stores", "Store operations into the host tier", registry=r
        )
        self.adapter_stored_blocks = Counter(
            "tenure_adapter_stored_blocks", "Blocks stored into the host tier", registry=r
        )
        self.adapter_refusals = Counter(
            "tenure_adapter_refusals", "Stores refused by the capacity gate", registry=r
        )
        self.adapter_refused_blocks = Counter(
            "tenure_adapter_refused_blocks", "Blocks refused by the capacity gate", registry=r
        )
        self.adapter_evicted_blocks = Counter(
            "tenure_adapter_evicted_blocks", "Blocks evicted from the host tier, by class",
            ["class"], registry=r,
        )  # fmt: skip
        self.adapter_host_hit_blocks = Counter(
            "tenure_adapter_host_hit_blocks", "Blocks served from the host tier", registry=r
        )
        self.adapter_loads = Counter(
            "tenure_adapter_loads", "Load operations from the host tier", registry=r
        )
        self.adapter_bytes_stored = Counter(
            "tenure_adapter_bytes_stored", "Bytes written to the host tier", registry=r
        )
        self.adapter_bytes_loaded = Counter(
            "tenure_adapter_bytes_loaded", "Bytes loaded back from the host tier", registry=r
        )
        self.adapter_ttl_expiries = Counter(
            "tenure_adapter_ttl_expiries", "Host copies discarded when their TTL expired",
            registry=r,
        )  # fmt: skip
        self.adapter_ttl_repriced = Counter(
            "tenure_adapter_ttl_repriced",
            "Held host copies given a new timer because their tenant's rent rate moved",
            registry=r,
        )  # fmt: skip
        self.adapter_resident_bytes = Gauge(
            "tenure_adapter_resident_bytes", "Bytes resident per tier, by adapter",
            ["adapter", "tier"], registry=r,
        )  # fmt: skip
        self.session_moves = Counter(
            "tenure_session_moves",
            "Sessions that arrived at an engine with earlier turns it never saw (moved there "
            "by the router, or the engine restarted), by the engine's adapter id",
            ["adapter"], registry=r,
        )  # fmt: skip
        self.adapter_sessions_tracked = Gauge(
            "tenure_adapter_sessions_tracked", "Sessions an adapter tracks", ["adapter"],
            registry=r,
        )  # fmt: skip
        # SSD-tier placement (tenure-fs tiers' reports), per adapter: an engine's own SSD.
        self.placement_write_bytes = Counter(
            "tenure_placement_write_bytes",
            "KV bytes written per offload tier (dram, ssd) and segment class, by adapter; ssd "
            "bytes as measured on the filesystem",
            ["adapter", "tier", "segment_class"], registry=r,
        )  # fmt: skip
        self.placement_kept_off_ssd_bytes = Counter(
            "tenure_placement_kept_off_ssd_bytes",
            "KV bytes stored in DRAM that placement kept off the SSD tier, by segment class",
            ["adapter", "segment_class"], registry=r,
        )  # fmt: skip
        self.placement_deleted_bytes = Counter(
            "tenure_placement_deleted_bytes",
            "SSD-tier bytes deleted because their segment closed, by segment class",
            ["adapter", "segment_class"], registry=r,
        )  # fmt: skip
        self.placement_deleted_files = Counter(
            "tenure_placement_deleted_files", "SSD-tier files deleted at segment boundaries",
            ["adapter"], registry=r,
        )  # fmt: skip
        self.placement_ssd_used_bytes = Gauge(
            "tenure_placement_ssd_used_bytes", "Bytes of KV files on the SSD tier",
            ["adapter"], registry=r,
        )  # fmt: skip
        self.placement_ssd_files = Gauge(
            "tenure_placement_ssd_files", "KV files on the SSD tier", ["adapter"], registry=r
        )
        self.placement_ssd_capacity_bytes = Gauge(
            "tenure_placement_ssd_capacity_bytes",
            "Configured SSD tier capacity (0: not configured)", ["adapter"], registry=r,
        )  # fmt: skip
        self.placement_ssd_write_rate = Gauge(
            "tenure_placement_ssd_write_rate_bytes_per_second",
            "SSD write rate (exponentially weighted)", ["adapter"], registry=r,
        )  # fmt: skip
        self.placement_ssd_device_years = Gauge(
            "tenure_placement_ssd_projected_device_years",
            "Projected SSD lifetime at the current write rate, 24x7 (-1: not configured or "
            "nothing written)", ["adapter"], registry=r,
        )  # fmt: skip
        self.placement_ssd_warranty_years = Gauge(
            "tenure_placement_ssd_warranty_years",
            "The SSD's warranty period (0: not configured)", ["adapter"], registry=r,
        )  # fmt: skip
        #: The online retention controller's gauges and the resume outcomes.
        self.retention = RetentionMetrics(r)

    def count_moves(self, adapter: str, sessions: int) -> None:
        if sessions > 0:
            self.session_moves.labels(adapter).inc(sessions)

    def record_residency(self, report: ResidencyReport) -> None:
        """Add one adapter report's deltas (negative deltas are ignored: counters only rise)
        and set its gauges under the report's own (bounded) adapter id."""
        self.record_counters(report)
        self.record_gauges(report, self.adapter_label(report.adapter_id))

    def record_counters(self, report: ResidencyReport) -> None:
        """Add one adapter report's counter deltas (negative deltas are ignored)."""
        _add(self.adapter_stores, report.stores)
        _add(self.adapter_stored_blocks, report.stored_blocks)
        _add(self.adapter_refusals, report.refusals)
        _add(self.adapter_refused_blocks, report.refused_blocks)
        _add(self.adapter_host_hit_blocks, report.host_hit_blocks)
        _add(self.adapter_loads, report.loads)
        _add(self.adapter_bytes_stored, report.bytes_stored)
        _add(self.adapter_bytes_loaded, report.bytes_loaded)
        _add(self.adapter_ttl_expiries, report.ttl_expiries)
        _add(self.adapter_ttl_repriced, report.ttl_repriced)
        for cls, blocks in report.evicted_blocks.items():
            if blocks > 0:
                # Only the core's own classes: the sender's text is not a label.
                self.adapter_evicted_blocks.labels(cls if cls in _EVICTION_CLASSES else OTHER).inc(
                    blocks
                )

    def record_gauges(self, report: ResidencyReport, adapter: str) -> None:
        """One report's gauges under ``adapter``, a label the caller has bounded (the name
        an authenticated key was given, or the report's id through :attr:`adapter_label`)."""
        for tier, resident in report.resident_bytes.items():
            self.adapter_resident_bytes.labels(adapter, self._tier_label(tier)).set(resident)
        self.adapter_sessions_tracked.labels(adapter).set(report.sessions_tracked)

    def record_placement(self, report: PlacementReport, adapter: str) -> None:
        """One tier's placement report under ``adapter`` (a label the caller has bounded).
        Tier and class names outside the known sets share ``other``: the sender's text is not
        a label. Negative deltas are ignored (counters only rise)."""
        for tier, by_class in report.write_bytes.items():
            tier_label = tier if tier in _PLACEMENT_TIERS else OTHER
            for cls, n in by_class.items():
                if n > 0:
                    self.placement_write_bytes.labels(adapter, tier_label, _cls(cls)).inc(n)
        for cls, n in report.kept_off_ssd_bytes.items():
            if n > 0:
                self.placement_kept_off_ssd_bytes.labels(adapter, _cls(cls)).inc(n)
        for cls, n in report.deleted_bytes.items():
            if n > 0:
                self.placement_deleted_bytes.labels(adapter, _cls(cls)).inc(n)
        if report.deleted_files > 0:
            self.placement_deleted_files.labels(adapter).inc(report.deleted_files)
        self.placement_ssd_used_bytes.labels(adapter).set(max(0, report.ssd_used_bytes))
        self.placement_ssd_files.labels(adapter).set(max(0, report.ssd_files))
        self.placement_ssd_capacity_bytes.labels(adapter).set(max(0, report.ssd_capacity_bytes))
        self.placement_ssd_write_rate.labels(adapter).set(
            max(0.0, report.ssd_write_rate_bytes_per_s)
        )
        years = report.projected_device_years
        self.placement_ssd_device_years.labels(adapter).set(
            -1.0 if years is None or not years >= 0 else years
        )
        self.placement_ssd_warranty_years.labels(adapter).set(max(0.0, report.ssd_warranty_years))

    def count_decision(self, kind: str, reason: str) -> None:
        # Reasons name a role the client chose for spawned workers: bounded like any label.
        self.decisions.labels(kind, self._reason_label(reason)).inc()

    def set_sessions(self, by_state: Mapping[str, int]) -> None:
        for state in ("active", "idle", "suspended", "finished"):
            self.sessions.labels(state).set(by_state.get(state, 0))


def _cls(value: str) -> str:
    return value if value in _PLACEMENT_CLASSES else OTHER


def _add(counter: Counter, delta: int) -> None:
    if delta > 0:
        counter.inc(delta)
