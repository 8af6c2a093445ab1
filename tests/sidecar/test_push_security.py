"""The push channel's security (issue 10, hole 13): CURVE, ipc permissions, untrusted labels.

Real ZeroMQ peers (DEALER sockets, and the engine adapter's own ``PushClient`` on the real
policy object) against the real sidecar and Redis.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

import httpx
import pytest
import zmq

from tenure.service.settings import SettingsError, load_settings
from tenure.service.wire.push import Decision, Hello, ResidencyReport, Snapshot, decode, encode
from tests.conftest import wait_for
from tests.sidecar.fake_upstream import free_port

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
CHAT = "/v1/chat/completions"


class Dealer:
    def __init__(
        self,
        addr: str,
        *,
        server_key: bytes | None = None,
        keys: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.ctx = zmq.Context()
        self.socket = self.ctx.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if server_key is not None:
            public, secret = keys or zmq.curve_keypair()
            self.socket.curve_serverkey = server_key
            self.socket.curve_secretkey = secret
            self.socket.curve_publickey = public
        self.socket.connect(addr)

    def send(self, message) -> None:
        # A refused handshake leaves no peer to queue for: never block on it.
        with contextlib.suppress(zmq.Again):
            self.socket.send(encode(message), zmq.NOBLOCK)

    def receive(self, kind: type, timeout_s: float = 10.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.socket.poll(int(max(1, (deadline - time.monotonic()) * 1000))):
                message = decode(self.socket.recv())
                if isinstance(message, kind):
                    return message
        return None

    def close(self) -> None:
        self.socket.close(linger=0)
        self.ctx.term()


def _metric_lines(server, name: str) -> list[str]:
    text = httpx.get(f"{server.url}/metrics").text
    return [line for line in text.splitlines() if line.startswith(name + "{")]


@pytest.fixture
def curve(sidecar_factory):
    server_public, server_secret = zmq.curve_keypair()
    engine_public, engine_secret = zmq.curve_keypair()
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(
        push_addr=addr,
        push_curve_secret_key=server_secret.decode(),
        push_curve_client_keys={"engine-0": engine_public.decode()},
    )
    return server, addr, server_public, (engine_public, engine_secret)


def test_curve_admits_only_listed_adapter_keys(curve):
    server, addr, server_public, (engine_public, engine_secret) = curve
    httpx.post(f"{server.url}{CHAT}", json={"model": "echo", "messages": []},
               headers={"X-Tenure-Session": "secret-session"})  # fmt: skip
    plain = Dealer(addr)
    stranger = Dealer(addr, server_key=server_public)  # a valid CURVE key, not on the list
    listed = Dealer(addr, server_key=server_public, keys=(engine_public, engine_secret))
    try:
        for peer in (plain, stranger):
            peer.send(Hello(adapter_id="engine-0"))
            assert peer.receive(Snapshot, timeout_s=1.0) is None
        listed.send(Hello(adapter_id="claims-to-be-someone-else"))
        snap = listed.receive(Snapshot)
        assert snap is not None
        assert "default/secret-session" in {d.session_id for d in snap.decisions}
        # The label is the name the key was given, never what the sender says.
        listed.send(ResidencyReport(adapter_id="evil\nlabel", report_seq=1, at=time.time(),
                                    resident_bytes={"cpu": 5}, sessions_tracked=2))  # fmt: skip
        wait_for(lambda: _metric_lines(server, "tenure_adapter_sessions_tracked"))
        assert _metric_lines(server, "tenure_adapter_sessions_tracked") == [
            'tenure_adapter_sessions_tracked{adapter="engine-0"} 2.0'
        ]
        assert httpx.get(f"{server.url}/healthz").json()["push_adapters"] == ["engine-0"]
    finally:
        for peer in (plain, stranger, listed):
            peer.close()


def test_the_adapter_push_client_speaks_curve(curve):
    from tenure.engine_adapter.policies import policy_class_for
    from tenure.engine_adapter.push_client import PushClient

    server, addr, server_public, (_engine_public, engine_secret) = curve
    policy = policy_class_for("tenure")(cache_capacity=16)
    client = PushClient(
        addr, policy, hello_interval_s=0.3, report_interval_s=0.05,
        server_key=server_public.decode(), client_secret_key=engine_secret.decode(),
    )  # fmt: skip
    client.start()
    try:
        assert wait_for(lambda: client.counters["snapshots"] >= 1, timeout_s=10)
        httpx.post(f"{server.url}{CHAT}", json={"model": "echo", "messages": []},
                   headers={"X-Tenure-Session": "s"})  # fmt: skip
        assert wait_for(lambda: client.counters["decisions"] >= 1, timeout_s=10)
        assert wait_for(lambda: _metric_lines(server, "tenure_push_seq_behind"))
        assert _metric_lines(server, "tenure_push_seq_behind")[0].startswith(
            'tenure_push_seq_behind{adapter="engine-0"}'
        )
    finally:
        client.stop()


def test_an_impostor_sidecar_cannot_push_to_a_curve_adapter():
    """Without the sidecar's secret key nobody can pose as it: no decision is applied."""
    from tenure.engine_adapter.policies import policy_class_for
    from tenure.engine_adapter.push_client import PushClient

    real_public, _real_secret = zmq.curve_keypair()
    _other_public, other_secret = zmq.curve_keypair()
    addr = f"tcp://127.0.0.1:{free_port()}"
    ctx = zmq.Context()
    impostor = ctx.socket(zmq.ROUTER)
    impostor.setsockopt(zmq.LINGER, 0)
    impostor.curve_server = True
    impostor.curve_secretkey = other_secret
    impostor.curve_publickey = zmq.curve_public(other_secret)
    impostor.bind(addr)
    plain = ctx.socket(zmq.ROUTER)
    plain.setsockopt(zmq.LINGER, 0)
    policy = policy_class_for("tenure")(cache_capacity=16)
    client = PushClient(addr, policy, hello_interval_s=0.2, server_key=real_public.decode())
    client.start()
    try:
        # The handshake fails: the impostor never even hears a Hello.
        assert impostor.poll(1500) == 0
        assert client.counters["snapshots"] == 0 and not policy.inbox
    finally:
        client.stop()
        impostor.close(linger=0)
        plain.close(linger=0)
        ctx.term()


def test_ipc_socket_is_private_to_the_sidecars_user(sidecar_factory, tmp_path):
    path = tmp_path / "push" / "tenure.sock"
    path.parent.mkdir()
    server = sidecar_factory(push_addr=f"ipc://{path}")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode == 0o600
    peer = Dealer(f"ipc://{path}")
    try:
        peer.send(Hello(adapter_id="local"))
        assert peer.receive(Snapshot) is not None
    finally:
        peer.close()
    shared = sidecar_factory(push_addr=f"ipc://{tmp_path / 'group.sock'}", push_ipc_mode="660")
    assert stat.S_IMODE(os.stat(tmp_path / "group.sock").st_mode) == 0o660
    assert server and shared


def test_a_network_address_needs_curve_or_an_explicit_opt_out():
    with pytest.raises(SettingsError, match="not authenticated"):
        load_settings(admin_token="a-long-enough-token", push_addr="tcp://0.0.0.0:5557")
    with pytest.raises(SettingsError, match="not authenticated"):
        load_settings(admin_token="a-long-enough-token", push_addr="tcp://*:5557")
    insecure = load_settings(
        admin_token="a-long-enough-token", push_addr="tcp://0.0.0.0:5557", push_insecure=True
    )
    assert any("without CURVE" in w for w in insecure.startup_warnings())
    _public, secret = zmq.curve_keypair()
    secured = load_settings(admin_token="a-long-enough-token", push_addr="tcp://0.0.0.0:5557",
                            push_curve_secret_key=secret.decode())  # fmt: skip
    assert secret.decode() not in repr(secured) + str(secured.model_dump())
    with pytest.raises(SettingsError, match="Z85"):
        load_settings(admin_token="a-long-enough-token", push_curve_secret_key="short")


def test_sender_supplied_labels_are_bounded(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr, push_max_adapters=8)
    peers = [Dealer(addr) for _ in range(12)]
    try:
        for i, peer in enumerate(peers):
            for seq in range(1, 6):
                peer.send(ResidencyReport(
                    adapter_id=f"adapter-{i}-{seq}", report_seq=seq, at=time.time(),
                    evicted_blocks={f"class-{i}-{seq}": 1, "finished": 1},
                    resident_bytes={f"tier-{i}-{seq}": 1}, sessions_tracked=1,
                ))  # fmt: skip
        wait_for(lambda: len(_metric_lines(server, "tenure_adapter_sessions_tracked")) >= 8)
        time.sleep(0.3)
        adapters = _metric_lines(server, "tenure_adapter_sessions_tracked")
        assert len(adapters) == 8  # one per admitted peer, never one per claimed name
        classes = _metric_lines(server, "tenure_adapter_evicted_blocks_total")
        assert {line.split('"')[1] for line in classes} == {"finished", "other"}
        tiers = {line.split('tier="')[1].split('"')[0]
                 for line in _metric_lines(server, "tenure_adapter_resident_bytes")}  # fmt: skip
        assert len(tiers) <= 9 and "other" in tiers  # a budget of 8 names, then "other"
        refused = httpx.get(f"{server.url}/metrics").text
        assert "tenure_push_refused_peers_total 0.0" not in refused
    finally:
        for peer in peers:
            peer.close()


def test_snapshots_per_peer_are_rate_limited(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    sidecar_factory(push_addr=addr, push_snapshot_interval_s=60)
    peer = Dealer(addr)
    try:
        for _ in range(30):
            peer.send(Hello(adapter_id="chatty"))
        got = 0
        while peer.receive(Snapshot, timeout_s=0.5) is not None:
            got += 1
        # A burst of 4, then one a second (a slow machine may refill a few): never 30.
        assert 1 <= got <= 10
    finally:
        peer.close()


def test_decisions_still_flow_without_curve_on_loopback(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr)
    peer = Dealer(addr)
    try:
        peer.send(Hello(adapter_id="a"))
        assert peer.receive(Snapshot) is not None
        httpx.post(f"{server.url}{CHAT}", json={"model": "echo", "messages": []},
                   headers={"X-Tenure-Session": "x"})  # fmt: skip
        assert peer.receive(Decision) is not None
    finally:
        peer.close()
