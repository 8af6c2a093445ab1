"""SSD-tier placement accounting over the push channel: the ``tenure-fs`` tier's reports on its
engine's one :class:`PushClient` (a real ZeroMQ DEALER and thread) against a real sidecar.

The tier's totals come from a source the test advances (the tier itself needs a vLLM engine:
``tests/engine/test_tiering_engine.py`` checks its totals against the bytes on disk).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import psutil

from tenure.engine_adapter.placement_push import PlacementTotals, placement_delta
from tenure.engine_adapter.policy import TenureCachePolicy
from tenure.engine_adapter.push_client import PushClient, engine_push_client
from tenure.service.wire.push import Hello, PlacementReport, Snapshot
from tests.conftest import wait_for
from tests.sidecar.fake_upstream import free_port
from tests.sidecar.test_push import Peer, _metric

MIB = 1 << 20


class Totals:
    """What a tier has counted so far (the push thread reads it, the test writes it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = PlacementTotals(placement="lachesis-wt")

    def set(self, **fields: object) -> None:
        with self._lock:
            self.value = PlacementTotals(placement="lachesis-wt", **fields)  # type: ignore[arg-type]

    def __call__(self) -> PlacementTotals:
        with self._lock:
            return self.value


def _pusher(addr: str, totals: Totals, adapter_id: str, interval_s: float) -> PushClient:
    """A connection that carries only a tier's reports (vLLM's own manager over the tier)."""
    client = PushClient(addr, None, adapter_id=adapter_id)
    client.report_placement(totals, interval_s)
    client.start()
    return client


def _metrics(server) -> str:
    with httpx.Client(base_url=server.url) as http:
        return http.get("/metrics").text


def _placement(text: str, metric: str, **labels: str) -> float:
    # prometheus_client writes the labels in name order.
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return _metric(text, f"tenure_placement_{metric}{{{inner}}}")


def test_tier_reports_reach_the_sidecar_metrics(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=0.5)
    totals = Totals()
    writes = {("dram", "reasoning"): 4 * MIB, ("dram", "lead"): 6 * MIB, ("ssd", "lead"): 6 * MIB}
    totals.set(
        write_bytes=writes,
        kept_off_ssd_bytes={"reasoning": 4 * MIB},
        ssd_used_bytes=6 * MIB, ssd_files=3, ssd_capacity_bytes=3_840_000_000_000,
        ssd_warranty_years=5.0, ssd_write_rate_bytes_per_s=1000.0, projected_device_years=2.0e5,
    )  # fmt: skip
    pusher = _pusher(addr, totals, "e1-fs", 0.05)
    try:
        a = {"adapter": "e1-fs"}
        wait_for(lambda: _placement(_metrics(server), "ssd_files", **a) == 3)
        text = _metrics(server)
        assert (
            _placement(text, "write_bytes_total", **a, tier="ssd", segment_class="lead") == 6 * MIB
        )
        dram_reasoning = {**a, "tier": "dram", "segment_class": "reasoning"}
        assert _placement(text, "write_bytes_total", **dram_reasoning) == 4 * MIB
        # Reasoning never reached the SSD: no series for it at all.
        assert 'segment_class="reasoning",tier="ssd"' not in text
        kept = _placement(text, "kept_off_ssd_bytes_total", **a, segment_class="reasoning")
        assert kept == 4 * MIB
        assert _placement(text, "ssd_used_bytes", **a) == 6 * MIB
        assert _placement(text, "ssd_capacity_bytes", **a) == 3.84e12
        assert _placement(text, "ssd_projected_device_years", **a) == 2.0e5
        assert _placement(text, "ssd_warranty_years", **a) == 5
        # A worker returns: its files are deleted. The sidecar adds the deltas once, however
        # many reports (and periodic snapshots in between) pass.
        totals.set(
            write_bytes={**writes, ("dram", "worker"): 3 * MIB, ("ssd", "worker"): 3 * MIB},
            kept_off_ssd_bytes={"reasoning": 4 * MIB},
            deleted_bytes={"worker": 3 * MIB}, deleted_files=3,
            ssd_used_bytes=6 * MIB, ssd_files=3, ssd_capacity_bytes=3_840_000_000_000,
            ssd_warranty_years=5.0, ssd_write_rate_bytes_per_s=1500.0, projected_device_years=1.4e5,
        )  # fmt: skip
        wait_for(lambda: _placement(_metrics(server), "deleted_files_total", **a) == 3)
        time.sleep(0.6)  # more reports and a snapshot broadcast go by
        text = _metrics(server)
        assert (
            _placement(text, "write_bytes_total", **a, tier="ssd", segment_class="lead") == 6 * MIB
        )
        ssd_worker = {**a, "tier": "ssd", "segment_class": "worker"}
        assert _placement(text, "write_bytes_total", **ssd_worker) == 3 * MIB
        assert _placement(text, "deleted_bytes_total", **a, segment_class="worker") == 3 * MIB
        assert _placement(text, "ssd_projected_device_years", **a) == 1.4e5
        assert pusher.counters["received_dropped"] >= 1  # the snapshots it has no use for
        assert _metric(text, 'tenure_push_messages_total{direction="in",kind="placement"}') >= 2
    finally:
        pusher.stop()


def test_duplicates_and_foreign_labels_are_bounded(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=60)
    peer = Peer(addr)
    try:
        peer.send(Hello(adapter_id="e2-fs"))
        peer.receive(Snapshot)
        report = PlacementReport(
            adapter_id="e2-fs", report_seq=1, at=time.time(),
            write_bytes={"ssd": {"lead": 100, "session-1234": 7}, "tape": {"lead": 5}},
            kept_off_ssd_bytes={"reasoning": -50},  # negative deltas never lower a counter
            deleted_bytes={"x" * 300: 9}, ssd_used_bytes=100, projected_device_years=None,
        )  # fmt: skip
        peer.send(report)
        peer.send(report)  # a duplicate: counted once
        a = {"adapter": "e2-fs"}
        wait_for(lambda: _placement(_metrics(server), "ssd_used_bytes", **a) == 100)
        text = _metrics(server)
        assert _placement(text, "write_bytes_total", **a, tier="ssd", segment_class="lead") == 100
        # Names outside the tier and class sets are no labels: they share "other".
        assert _placement(text, "write_bytes_total", **a, tier="ssd", segment_class="other") == 7
        assert _placement(text, "write_bytes_total", **a, tier="other", segment_class="lead") == 5
        assert _placement(text, "deleted_bytes_total", **a, segment_class="other") == 9
        assert "session-1234" not in text and "tape" not in text
        assert 'segment_class="reasoning"' not in text
        assert _placement(text, "ssd_projected_device_years", **a) == -1
    finally:
        peer.close()


def test_reports_wait_for_a_sidecar_and_lose_nothing(sidecar_factory):
    """With nobody listening the deltas stay pending; once a sidecar binds, they all arrive."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    totals = Totals()
    totals.set(write_bytes={("ssd", "lead"): 8 * MIB}, ssd_used_bytes=8 * MIB, ssd_files=4)
    pusher = _pusher(addr, totals, "e3-fs", 0.05)
    try:
        wait_for(lambda: pusher.counters["send_dropped"] >= 2)
        totals.set(write_bytes={("ssd", "lead"): 12 * MIB}, ssd_used_bytes=12 * MIB, ssd_files=6)
        server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=60)
        a = {"adapter": "e3-fs"}
        wait_for(lambda: _placement(_metrics(server), "ssd_files", **a) == 6, timeout_s=10)
        text = _metrics(server)
        assert (
            _placement(text, "write_bytes_total", **a, tier="ssd", segment_class="lead") == 12 * MIB
        )
    finally:
        pusher.stop()


def _push_connections(port: int) -> int:
    """This process's TCP connections to ``port`` (the sidecar's push server's)."""
    return sum(
        1
        for c in psutil.Process(os.getpid()).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def test_one_engine_opens_one_connection_for_decisions_and_placement(sidecar_factory):
    """Tenure's manager and the SSD tier of one engine share one push connection: one peer at
    the sidecar, one TCP connection from the engine, while decisions come in and residency and
    placement reports go out."""
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=0.2)
    spec: Any = type("Spec", (), {})()  # vLLM's offloading spec of the one engine
    policy = TenureCachePolicy(cache_capacity=16)
    totals = Totals()
    totals.set(write_bytes={("ssd", "lead"): 2 * MIB}, ssd_used_bytes=2 * MIB, ssd_files=1)
    # As the engine builds them: the manager's connection (spec.py), then the tier's (tiering.py).
    client = engine_push_client(spec, addr, policy, adapter_id="e4", report_interval_s=0.05)
    tier_client = engine_push_client(spec, addr, adapter_id="e4-fs")
    tier_client.report_placement(totals, 0.05)
    try:
        assert tier_client is client
        policy.stats["stores"] += 1  # something for the residency report to carry
        a = {"adapter": "e4"}
        wait_for(lambda: _placement(_metrics(server), "ssd_files", **a) == 1)
        residency = 'tenure_push_messages_total{direction="in",kind="residency"}'
        wait_for(lambda: _metric(_metrics(server), residency) >= 1)
        wait_for(lambda: len(policy.inbox) >= 1)  # the sidecar's snapshots reach the policy
        with httpx.Client(base_url=server.url) as http:
            assert http.get("/healthz").json()["push_adapters"] == ["e4"]
        assert _push_connections(port) == 1
        assert client.counters["sent_PlacementReport"] >= 1
        assert client.counters["sent_ResidencyReport"] >= 1
        assert client.counters["snapshots"] >= 1 and "received_dropped" not in client.counters
    finally:
        client.stop()


def test_delta_of_a_restarted_tier_clamps_to_zero():
    before = PlacementTotals(write_bytes={("ssd", "lead"): 10}, deleted_files=4)
    after = PlacementTotals(write_bytes={("ssd", "lead"): 3, ("ssd", "worker"): 2}, deleted_files=1)
    report = placement_delta(after, before, adapter_id="x", seq=2, at=0.0)
    assert report.write_bytes == {"ssd": {"worker": 2}}
    assert report.deleted_files == 0
