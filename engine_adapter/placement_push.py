"""The ``tenure-fs`` tier's placement accounting, pushed to the sidecar over the push channel.

vLLM's tiering path has no Tenure primary-tier policy and so no :class:`PushClient`; the SSD
tier reports on its own: a DEALER of its own to the sidecar's push ROUTER (the same address,
the same CURVE keys: ``TENURE_PUSH_SERVER_KEY`` / ``TENURE_PUSH_CLIENT_SECRET_KEY``) sending a
:class:`~tenure.service.wire.push.PlacementReport` every ``interval_s``: counter deltas since the
previous report (bytes written per tier and segment class, bytes kept off the SSD and deleted
per class, files deleted) and the gauges (SSD bytes and files in use, write rate, projected
device-years). Bounded by construction: the counters are per tier and class, never per session.

The thread reads the tier's totals (:class:`PlacementTotals`, a copy taken by
:meth:`tenure.engine_adapter.tiering.TenureFsTier.placement_totals`) and never touches the tier's
state otherwise; the engine never waits on it. With no sidecar connected a report is not
queued (``IMMEDIATE``) and its deltas stay pending: the next report that goes out carries
everything since the last one sent, so bytes are neither lost nor counted twice (the sidecar
drops a duplicate ``report_seq``).
Frames the sidecar sends this peer (snapshots, decisions for the DRAM policy it does not have)
are read and dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import zmq

from tenure.engine_adapter.push_socket import run_connected
from tenure.engine_adapter.settings import adapter_env
from tenure.service.wire.push import PlacementReport, encode

__all__ = ["PlacementPusher", "PlacementTotals", "placement_delta"]

log = logging.getLogger("vllm.tenure.push")

_POLL_MS = 50
#: Send a report at least this often (in intervals) even when nothing changed: the gauges.
_KEEPALIVE_REPORTS = 5


@dataclass(frozen=True, slots=True)
class PlacementTotals:
    """Cumulative placement counters of one tier and its current gauges."""

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
    return PlacementReport(
        adapter_id=adapter_id,
        report_seq=seq,
        at=at,
        placement=now.placement,
        write_bytes=writes,
        kept_off_ssd_bytes=_delta(now.kept_off_ssd_bytes, prev.kept_off_ssd_bytes),
        deleted_bytes=_delta(now.deleted_bytes, prev.deleted_bytes),
        deleted_files=max(0, now.deleted_files - prev.deleted_files),
        ssd_used_bytes=now.ssd_used_bytes,
        ssd_files=now.ssd_files,
        ssd_capacity_bytes=now.ssd_capacity_bytes,
        ssd_warranty_years=now.ssd_warranty_years,
        ssd_write_rate_bytes_per_s=now.ssd_write_rate_bytes_per_s,
        projected_device_years=now.projected_device_years,
    )


def _changed(report: PlacementReport) -> bool:
    return bool(
        report.write_bytes
        or report.kept_off_ssd_bytes
        or report.deleted_bytes
        or report.deleted_files
    )


class PlacementPusher:
    """One DEALER connection from a ``tenure-fs`` tier to the sidecar (a background thread)."""

    def __init__(
        self,
        addr: str,
        source: Callable[[], PlacementTotals],
        *,
        adapter_id: str | None = None,
        interval_s: float = 1.0,
        wall_clock: Callable[[], float] = time.time,
        server_key: str | None = None,
        client_secret_key: str | None = None,
    ) -> None:
        if not interval_s > 0:
            raise ValueError("the placement report interval must be positive")
        self.addr = addr
        self.source = source
        self.adapter_id = (
            adapter_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}-fs"
        )
        self.interval_s = interval_s
        env = adapter_env()
        self.server_key = server_key or env.push_server_key
        self._client_secret = client_secret_key or env.push_client_secret_key
        self._wall = wall_clock
        self.counters: Counter[str] = Counter()
        self._seq = 0
        self._reported: PlacementTotals | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report(self, *, force: bool = False) -> PlacementReport | None:
        """The next report, or ``None`` when no counter moved and it is not forced."""
        now = self.source()
        report = placement_delta(
            now, self._reported, adapter_id=self.adapter_id, seq=self._seq + 1, at=self._wall()
        )
        if not force and not _changed(report):
            return None
        self._reported = now
        self._seq += 1
        return report

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tenure-fs-push", daemon=True)
        self._thread.start()
        log.info(
            "tenure-fs placement reports: %s -> %s every %gs (CURVE %s)",
            self.adapter_id,
            self.addr,
            self.interval_s,
            "on" if self.server_key is not None else "off",
        )

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        run_connected(
            self.addr, self._loop, server_key=self.server_key, client_secret=self._client_secret,
            send_hwm=100, log=log, what="tenure-fs placement reports",
        )  # fmt: skip

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        next_report = time.monotonic() + self.interval_s
        idle = _KEEPALIVE_REPORTS  # the first report goes out at once: gauges for a new peer
        while not self._stop.is_set():
            if sock.poll(_POLL_MS):
                while True:  # nothing the sidecar sends concerns this peer
                    try:
                        sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self.counters["received_dropped"] += 1
            if time.monotonic() < next_report:
                continue
            next_report = time.monotonic() + self.interval_s
            pending = (self._reported, self._seq)
            report = self.report(force=idle >= _KEEPALIVE_REPORTS)
            if report is None:
                idle += 1
                continue
            idle = 0
            try:
                sock.send(encode(report), zmq.NOBLOCK)
                self.counters["sent"] += 1
            except zmq.Again:
                # No sidecar connected: nothing queues; keep the deltas for the next report.
                self._reported, self._seq = pending
                self.counters["send_dropped"] += 1
