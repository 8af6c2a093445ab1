"""The push channel with a real ZeroMQ DEALER peer playing the engine adapter."""

from __future__ import annotations

import time

import httpx
import pytest
import zmq

from tenure.service.wire.push import (
    Decision,
    Hello,
    ResidencyReport,
    ResyncRequest,
    Snapshot,
    decode,
    encode,
)
from tests.conftest import wait_for
from tests.sidecar.fake_upstream import free_port

ADMIN = {"Authorization": "Bearer test-admin-token"}
CHAT = "/v1/chat/completions"


class Peer:
    def __init__(self, addr: str) -> None:
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(addr)

    def send(self, message) -> None:
        self.socket.send(encode(message))

    def receive(self, kind: type, timeout_s: float = 5.0):
        """The next message of ``kind`` (others are skipped)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.socket.poll(int(max(1, (deadline - time.monotonic()) * 1000))):
                message = decode(self.socket.recv())
                if isinstance(message, kind):
                    return message
        raise AssertionError(f"no {kind.__name__} within {timeout_s}s")

    def close(self) -> None:
        self.socket.close(linger=0)
        self.ctx.term()


def _metric(text: str, line_prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _after(peer: Peer, seq: int) -> Decision:
    """The next decision newer than ``seq`` (older ones are the snapshot's duplicates)."""
    while True:
        decision: Decision = peer.receive(Decision)
        if decision.seq > seq:
            return decision


@pytest.fixture
def pushed(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=60)
    peer = Peer(addr)
    try:
        yield server, peer
    finally:
        peer.close()


def test_hello_snapshot_then_decisions_in_sequence(pushed):
    server, peer = pushed
    with httpx.Client(base_url=server.url) as http:
        chat = {"model": "echo", "messages": [{"role": "user", "content": "x"}]}
        http.post(CHAT, json=chat, headers={"X-Tenure-Session": "before"})
        # The turn's end is recorded off the response path: wait for it, not a while.
        wait_for(lambda: http.get("/v1/sessions/before").json().get("state") == "idle")
        peer.send(Hello(adapter_id="a1", last_seq=-1))
        snap = peer.receive(Snapshot)
        assert snap.config.policy_mode == "tenure"
        ids = {d.session_id for d in snap.decisions}
        assert "default/before" in ids
        http.post(CHAT, json=chat, headers={"X-Tenure-Session": "after", "X-Tenure-Last-Turn": "1"})
        # The stream's tail may still hand over what the snapshot holds already (the turn's
        # end was recorded before the Hello, but forwarded after): an adapter drops those as
        # duplicates of the snapshot, and so does this peer.
        first = _after(peer, snap.seq)
        second = _after(peer, snap.seq)
    assert first.session_id == second.session_id == "default/after"
    assert first.seq > snap.seq
    assert second.seq == first.seq + 1
    assert (first.state, second.state) == ("active", "finished")
    assert second.reason == "last_turn" and second.last_turn


def test_residency_reports_feed_metrics_once(pushed):
    server, peer = pushed
    peer.send(Hello(adapter_id="a1"))
    peer.receive(Snapshot)
    report = ResidencyReport(
        adapter_id="a1", report_seq=1, at=time.time(), stores=3, stored_blocks=40, refusals=2,
        refused_blocks=16, evicted_blocks={"finished": 8, "overdue": 4}, host_hit_blocks=12,
        bytes_stored=4096, bytes_loaded=1024, resident_bytes={"cpu": 2048}, sessions_tracked=5,
    )  # fmt: skip
    peer.send(report)
    peer.send(report)  # a duplicate: must not be counted twice
    peer.send(ResyncRequest(adapter_id="a1", last_seq=0))
    peer.receive(Snapshot)
    with httpx.Client(base_url=server.url) as http:
        text = http.get("/metrics").text
    assert _metric(text, "tenure_adapter_stored_blocks_total") == 40
    assert _metric(text, "tenure_adapter_refusals_total") == 2
    assert _metric(text, 'tenure_adapter_evicted_blocks_total{class="finished"}') == 8
    assert _metric(text, "tenure_adapter_host_hit_blocks_total") == 12
    assert _metric(text, 'tenure_adapter_resident_bytes{adapter="a1",tier="cpu"}') == 2048
    assert _metric(text, "tenure_push_resyncs_total") == 1


def test_config_change_is_pushed_and_bad_frames_survived(pushed):
    server, peer = pushed
    peer.send(Hello(adapter_id="a2"))
    peer.receive(Snapshot)
    peer.socket.send(b"\x00not msgpack")
    with httpx.Client(base_url=server.url, headers=ADMIN) as http:
        patch = {"policy_mode": "lru", "host_capacity_bytes": {"cpu": 1 << 20}}
        assert http.patch("/admin/config", json=patch).status_code == 200
        snap = peer.receive(Snapshot)
        assert snap.config.policy_mode == "lru"
        assert snap.config.host_capacity_bytes == 1 << 20
        assert _metric(http.get("/metrics").text, "tenure_push_bad_frames_total") == 1
        assert http.get("/healthz").json()["push_adapters"] == ["a2"]
