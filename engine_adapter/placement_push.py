"""The ``tenure-fs`` tier's placement accounting, reported over its engine's push connection.

The tier does not open a connection of its own: it hands :meth:`PushClient.report_placement
<tenure.engine_adapter.push_client.PushClient.report_placement>` the source of its totals, and the
engine's one :class:`~tenure.engine_adapter.push_client.PushClient` (the same DEALER, id and CURVE
keys that carry the sidecar's decisions) sends a :class:`~tenure.service.wire.push.PlacementReport`
every ``interval_s``: counter deltas since the previous report (bytes written per tier and
segment class, bytes kept off the SSD and deleted per class, files deleted) and the gauges (SSD
bytes and files in use, write rate, projected device-years). Bounded by construction: the
counters are per tier and class, never per session.

:class:`PlacementReports` is that reporting state (no socket, no thread). The push thread reads
the tier's totals (:class:`PlacementTotals`, a copy taken by
:meth:`tenure.engine_adapter.tiering.TenureFsTier.placement_totals`) and never touches the tier's
state otherwise; the engine never waits on it. With no sidecar connected a report is not
queued (``IMMEDIATE``) and its deltas stay pending: the next report that goes out carries
everything since the last one sent, so bytes are neither lost nor counted twice (the sidecar
drops a duplicate ``report_seq``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields

from tenure.service.wire.push import PlacementReport

__all__ = [
    "PLACEMENT_COUNTERS",
    "PLACEMENT_GAUGES",
    "PlacementReports",
    "PlacementTotals",
    "placement_delta",
]

#: Send a report at least this often (in intervals) even when nothing changed: the gauges.
_KEEPALIVE_REPORTS = 5


@dataclass(frozen=True, slots=True)
class PlacementTotals:
    """Cumulative placement counters of one tier and its current gauges.

    The fields of a :class:`~tenure.service.wire.push.PlacementReport` less its envelope
    (``adapter_id``, ``report_seq``, ``at``), by the same names: the counters are totals here
    and deltas there (``write_bytes`` keyed ``(tier, class)`` here, ``tier -> class`` there),
    the gauges are copied by name (:data:`PLACEMENT_GAUGES`).
    ``tests/sidecar/test_record_types.py`` ties the two field for field.
    """

    placement: str = ""
    #: (tier, segment class) -> bytes written.
    write_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    kept_off_ssd_bytes: Mapping[str, int] = field(default_factory=dict)
    deleted_bytes: Mapping[str, int] = field(default_factory=dict)
    deleted_files: int = 0
    ssd_used_bytes: int = 0
    ssd_files: int = 0
    ssd_capacity_bytes: int = 0
    ssd_warranty_years: float = 0.0
    ssd_write_rate_bytes_per_s: float = 0.0
    projected_device_years: float | None = None


#: The counters :func:`placement_delta` turns into deltas; every other field is a gauge.
PLACEMENT_COUNTERS = ("write_bytes", "kept_off_ssd_bytes", "deleted_bytes", "deleted_files")
#: The fields copied into a report as they are.
PLACEMENT_GAUGES = tuple(
    f.name for f in fields(PlacementTotals) if f.name not in PLACEMENT_COUNTERS
)


def _delta(now: Mapping[str, int], before: Mapping[str, int]) -> dict[str, int]:
    out = {k: v - before.get(k, 0) for k, v in now.items()}
    return {k: v for k, v in out.items() if v > 0}


def placement_delta(
    now: PlacementTotals, before: PlacementTotals | None, *, adapter_id: str, seq: int, at: float
) -> PlacementReport:
    """The report for the change ``before -> now`` (counters only rise: negative deltas of a
    restarted tier clamp to 0)."""
    prev = before or PlacementTotals()
    writes: dict[str, dict[str, int]] = {}
    for (tier, cls), value in now.write_bytes.items():
        delta = value - prev.write_bytes.get((tier, cls), 0)
        if delta > 0:
            writes.setdefault(tier, {})[cls] = delta
    gauges = {name: getattr(now, name) for name in PLACEMENT_GAUGES}
    return PlacementReport(
        adapter_id=adapter_id,
        report_seq=seq,
        at=at,
        write_bytes=writes,
        kept_off_ssd_bytes=_delta(now.kept_off_ssd_bytes, prev.kept_off_ssd_bytes),
        deleted_bytes=_delta(now.deleted_bytes, prev.deleted_bytes),
        deleted_files=max(0, now.deleted_files - prev.deleted_files),
        **gauges,
    )


def _changed(report: PlacementReport) -> bool:
    return bool(
        report.write_bytes
        or report.kept_off_ssd_bytes
        or report.deleted_bytes
        or report.deleted_files
    )


class PlacementReports:
    """One tier's placement reports on a push connection: what was last sent, and when next.

    Driven by the connection's thread (:class:`~tenure.engine_adapter.push_client.PushClient`):
    every poll tick it asks :meth:`due`; a due report is built by :meth:`next` and, when the send
    failed, given back with :meth:`unsent` so its deltas go out with the next one.
    """

    def __init__(
        self, source: Callable[[], PlacementTotals], interval_s: float, *, now: float
    ) -> None:
        if not interval_s > 0:
            raise ValueError("the placement report interval must be positive")
        self.source = source
        self.interval_s = interval_s
        self._seq = 0
        self._reported: PlacementTotals | None = None
        self._pending: tuple[PlacementTotals | None, int] = (None, 0)
        #: The first report goes out at once: gauges for a new peer.
        self._idle = _KEEPALIVE_REPORTS
        self._next_at = now + interval_s

    def report(self, *, adapter_id: str, at: float, force: bool = False) -> PlacementReport | None:
        """The next report, or ``None`` when no counter moved and it is not forced."""
        now = self.source()
        report = placement_delta(
            now, self._reported, adapter_id=adapter_id, seq=self._seq + 1, at=at
        )
        if not force and not _changed(report):
            return None
        self._pending = (self._reported, self._seq)
        self._reported = now
        self._seq += 1
        return report

    def due(self, now: float) -> bool:
        return now >= self._next_at

    def next(self, now: float, *, adapter_id: str, at: float) -> PlacementReport | None:
        """The report due at ``now`` (monotonic), or ``None`` (nothing moved: not a keep-alive)."""
        self._next_at = now + self.interval_s
        report = self.report(adapter_id=adapter_id, at=at, force=self._idle >= _KEEPALIVE_REPORTS)
        if report is None:
            self._idle += 1
            return None
        self._idle = 0
        return report

    def unsent(self) -> None:
        """The last report was not sent (no sidecar connected): keep its deltas pending."""
        self._reported, self._seq = self._pending
