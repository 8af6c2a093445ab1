"""The adapter's push-channel client against a real ZeroMQ ROUTER peer (no engine needed).

Sequence handling, resync after a gap, duplicates, a restarted sidecar, residency reports,
and waking an idle engine, on the real policy object the engine would use.
"""

from __future__ import annotations

import time

import pytest

from tests.engine.router_peer import RouterPeer, reports

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture
def policy():
    from tenure.engine_adapter.policies import policy_class_for

    return policy_class_for("tenure")(cache_capacity=16)


@pytest.fixture
def peer():
    router = RouterPeer()
    yield router
    router.close()


@pytest.fixture
def client(policy, peer):
    from tenure.engine_adapter.push_client import PushClient

    wakes: list[float] = []
    push = PushClient(
        peer.addr,
        policy,
        engine_id="e1",
        bytes_per_block=1024,
        report_interval_s=0.05,
        hello_interval_s=0.3,
        waker=lambda: wakes.append(time.monotonic()),
    )
    push.wakes = wakes  # type: ignore[attr-defined]
    push.start()
    yield push
    push.stop()


def drain(policy) -> None:
    policy.poll()


def test_hello_then_snapshot_then_decisions_in_order(policy, peer, client):
    from tenure.service.wire.push import Hello

    assert peer.wait_for(lambda: bool(peer.messages(Hello)))
    hello = peer.messages(Hello)[0]
    assert hello.last_seq == -1 and hello.policy == "tenure" and hello.engine_id == "e1"
    assert peer.wait_for(lambda: client.counters["snapshots"] >= 1)

    peer.decide("t/s1", "idle", expected_gap_s=5.0)
    peer.decide("t/s2", "finished", last_turn=True)
    assert peer.wait_for(lambda: client.last_seq == 2)
    assert client.wakes, "queued decisions must wake an idle engine"
    drain(policy)
    assert policy.stats["decisions_applied"] == 2
    assert policy.last_applied_seq == 2


def test_gap_asks_for_resync_and_keeps_applying(policy, peer, client):
    from tenure.service.wire.push import ResyncRequest

    assert peer.wait_for(lambda: client.counters["snapshots"] >= 1)
    peer.decide("t/a", "idle", expected_gap_s=1.0)
    peer.decide("t/b", "idle", expected_gap_s=1.0, skip_seq=True)  # seq 3: 2 was lost
    assert peer.wait_for(lambda: bool(peer.messages(ResyncRequest)))
    resync = peer.messages(ResyncRequest)[0]
    assert resync.last_seq == 1 and resync.reason == "gap"
    # The resync is answered with a snapshot that carries both decisions.
    assert peer.wait_for(lambda: client.counters["snapshots"] >= 2)
    drain(policy)
    assert policy.stats["decisions_applied"] == 2  # the snapshot's copies are not re-applied
    assert client.counters["gaps"] == 1


def test_duplicates_are_dropped(policy, peer, client):
    assert peer.wait_for(lambda: client.counters["snapshots"] >= 1)
    peer.decide("t/a", "idle", expected_gap_s=1.0)
    assert peer.wait_for(lambda: client.last_seq == 1)
    peer.decide("t/a", "idle", expected_gap_s=1.0, resend=True)
    assert peer.wait_for(lambda: client.counters["duplicates"] == 1)
    drain(policy)
    assert policy.stats["decisions_applied"] == 1


def test_restarted_sidecar_is_noticed_and_resynced(policy, peer, client):
    from tenure.service.wire.push import Hello

    assert peer.wait_for(lambda: client.counters["snapshots"] >= 1)
    peer.decide("t/a", "suspended", host_ttl_s=600.0)
    assert peer.wait_for(lambda: client.last_seq == 1)
    port = peer.port
    peer.close()
    # A new sidecar on the same address, knowing one more decision (from Redis).
    reborn = RouterPeer(port=port)
    try:
        reborn.seq = 1
        reborn.decide("t/b", "finished", last_turn=True)
        assert reborn.wait_for(lambda: bool(reborn.messages(Hello)), timeout=10)
        assert reborn.messages(Hello)[-1].last_seq == 1
        assert reborn.wait_for(lambda: client.last_seq == 2, timeout=10)
        drain(policy)
        assert policy.last_applied_seq == 2
        assert policy.stats["decisions_applied"] == 2
    finally:
        reborn.close()


def test_reports_carry_counter_deltas(policy, peer, client):
    assert peer.wait_for(lambda: client.counters["snapshots"] >= 1)
    policy.stats["stores"] += 3
    policy.stats["stored_blocks"] += 7
    policy.stats["evicted_blocks_far_wakeup"] += 2
    assert peer.wait_for(lambda: sum(r.stored_blocks for r in reports(peer)) == 7)
    policy.stats["stored_blocks"] += 1
    policy.stats["refusals"] += 1
    assert peer.wait_for(lambda: sum(r.refusals for r in reports(peer)) == 1)
    got = reports(peer)
    assert sum(r.stored_blocks for r in got) == 8  # deltas, never totals twice
    assert sum(r.evicted_blocks.get("far_wakeup", 0) for r in got) == 2
    seqs = [r.report_seq for r in got]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_no_sidecar_nothing_queues(policy):
    from tenure.engine_adapter.push_client import PushClient
    from tests.conftest import free_port

    push = PushClient(
        f"tcp://127.0.0.1:{free_port()}", policy, report_interval_s=0.05, hello_interval_s=0.1
    )
    push.start()
    try:
        policy.stats["stores"] += 1
        deadline = time.monotonic() + 5
        while push.counters["send_dropped"] < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert push.counters["send_dropped"] >= 3
        assert not push.connected
        policy.poll()  # the engine thread's side: nothing to apply, nothing to wait for
        assert policy.stats["decisions_applied"] == 0
        assert not policy.inbox
    finally:
        push.stop()


def test_sidecar_starting_after_the_engine_gets_a_hello_at_once(policy):
    from tenure.engine_adapter.push_client import PushClient
    from tenure.service.wire.push import Hello
    from tests.conftest import free_port, wait_for

    port = free_port()
    push = PushClient(f"tcp://127.0.0.1:{port}", policy, hello_interval_s=60.0)
    push.start()
    try:
        # The adapter's first Hello found nobody (dropped: no sidecar to queue it for).
        assert wait_for(lambda: push.counters["send_dropped"] >= 1, timeout_s=10)
        late = RouterPeer(port=port)
        try:
            # Retried until sent, not after the 60 s interval.
            assert late.wait_for(lambda: bool(late.messages(Hello)), timeout=10)
            assert late.wait_for(lambda: push.counters["snapshots"] >= 1)
        finally:
            late.close()
    finally:
        push.stop()
