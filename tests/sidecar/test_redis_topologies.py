"""The sidecar on Redis Sentinel (failover) and on Redis Cluster, all real redis-server processes.

Durability promise under test (README, "Redis failover"): with asynchronous replication a
failover loses at most the writes the replica had not yet acknowledged when the master died
(the test marks a point, waits until the replica has everything acknowledged before it, then
kills the master: a fixed time window would be missed by a starved machine's replication lag);
with ``TENURE_REDIS_WAIT_REPLICAS=1`` no acknowledged write is lost. The proxy never fails
while Redis fails over: it forwards without lifecycle state (fail open) until the new master
answers.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import redis

from tenure.service.processes.redis_groups import ClusterGroup, SentinelGroup, redis_command
from tenure.service.state.breaker import Breaker
from tenure.service.state.keys import Keys
from tenure.service.state.records import StoreLimits
from tenure.service.state.store import StateStore
from tenure.service.state.topology import RedisTopology, connect
from tests.conftest import wait_for

CHAT = "/v1/chat/completions"


def _chat(text: str = "go") -> dict[str, object]:
    return {"model": "echo", "messages": [{"role": "user", "content": text}]}


class _Load:
    """Proxied requests in a loop from a thread; every status kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            i = 0
            while not self._stop.is_set():
                i += 1
                try:
                    reply = http.post(
                        CHAT, json=_chat(), headers={"X-Tenure-Session": f"load{i % 7}"}
                    )
                    self.statuses.append(reply.status_code)
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))

    def __enter__(self) -> _Load:
        self._thread.start()
        wait_for(lambda: len(self.statuses) >= 5, timeout_s=10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class _Writer:
    """Acknowledged lifecycle writes (suspend) in a loop; the ledger keeps when each was acked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            i = 0
            while not self._stop.is_set():
                i += 1
                session = f"w{i}"
                try:
                    if not http.post(
                        CHAT, json=_chat(), headers={"X-Tenure-Session": session}
                    ).is_success:
                        continue
                    reply = http.post(
                        f"/v1/sessions/{session}/suspend", json={"expected_wait_s": 600}
                    )
                except httpx.HTTPError:
                    continue
                if reply.status_code == 200:
                    self.acked[session] = time.monotonic()
                else:
                    time.sleep(0.05)  # 503 while Redis fails over: retry later, as a client would

    def __enter__(self) -> _Writer:
        self._thread.start()
        wait_for(lambda: len(self.acked) >= 3, timeout_s=15)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def _suspended(http: httpx.Client, session: str) -> bool:
    reply = http.get(f"/v1/sessions/{session}")
    return reply.status_code == 200 and reply.json()["state"] == "suspended"


@pytest.mark.parametrize("wait_replicas", [0, 1])
def test_sentinel_failover_keeps_acknowledged_sessions(
    sentinel_group: SentinelGroup, sidecar_factory, wait_replicas: int
):
    """Kill the master under load: the proxy never fails, lifecycle writes resume on the
    promoted replica, and every session acknowledged before the window (all of them with
    WAIT) is still there."""
    sidecar = sidecar_factory(
        redis_sentinels=sentinel_group.sentinel_addresses,
        redis_sentinel_master=sentinel_group.name,
        redis_retry_after_s=0.2,
        redis_wait_replicas=wait_replicas,
        redis_wait_timeout_ms=200,
    )
    http = httpx.Client(base_url=sidecar.url, timeout=10)
    try:
        with _Load(sidecar.url) as load, _Writer(sidecar.url) as writer:
            wait_for(lambda: len(writer.acked) >= 5, timeout_s=20)
            # Everything acknowledged before the mark is on the replica once this returns;
            # writes acknowledged after it ("late") may or may not be.
            marked_at = time.monotonic()
            sentinel_group.replicated_through_now()
            count = len(writer.acked)
            wait_for(lambda: len(writer.acked) >= count + 3, timeout_s=20)
            old = sentinel_group.kill_master()
            killed_at = time.monotonic()
            sentinel_group.wait_failover(old)
            # The dead master comes back as a replica (with WAIT and no replica at all every
            # write would wait out the WAIT timeout, serialised on the hot-path connection).
            sentinel_group.restart(old)
            # Writes go on against the new master without restarting the sidecar.
            count = len(writer.acked)
            wait_for(lambda: len(writer.acked) >= count + 5, timeout_s=20)
        assert not load.errors
        assert set(load.statuses) == {200}, "the proxy failed a request during the failover"
        early = [s for s, at in writer.acked.items() if at < marked_at]
        late = [s for s, at in writer.acked.items() if marked_at <= at < killed_at]
        lost_early = [s for s in early if not _suspended(http, s)]
        lost_late = [s for s in late if not _suspended(http, s)]
        assert early and not lost_early
        if wait_replicas:
            assert late and not lost_late, "WAIT acknowledged a write the failover lost"
        after = [s for s, at in writer.acked.items() if at > killed_at]
        assert after and all(_suspended(http, s) for s in after)
    finally:
        http.close()


def test_sentinel_manual_failover_demotes_master_under_live_connections(
    sentinel_group: SentinelGroup, sidecar_factory
):
    """A planned failover (the old master stays up, as a replica): connections that still point
    at it get READONLY; the sidecar drops them, finds the new master and the proxy never fails."""
    sidecar = sidecar_factory(
        redis_sentinels=sentinel_group.sentinel_addresses,
        redis_sentinel_master=sentinel_group.name,
        redis_retry_after_s=0.2,
    )
    http = httpx.Client(base_url=sidecar.url, timeout=10)
    try:
        with _Load(sidecar.url) as load:
            old = sentinel_group.master()
            assert redis_command(
                sentinel_group.sentinels[0].port, "SENTINEL", "FAILOVER", "tenure"
            ).startswith("+OK")
            sentinel_group.wait_failover(old)
            wait_for(
                lambda: "role:slave" in redis_command(old.port, "INFO", "replication"), timeout_s=20
            )

            def suspended_after_turn() -> bool:
                # A turn that failed open (the breaker was open) stored nothing: go again.
                assert http.post(
                    CHAT, json=_chat(), headers={"X-Tenure-Session": "after"}
                ).is_success
                reply = http.post("/v1/sessions/after/suspend", json={"expected_wait_s": 60})
                return reply.status_code == 200

            wait_for(suspended_after_turn, timeout_s=20, interval_s=0.1)
        assert set(load.statuses) == {200}
        assert _suspended(http, "after")
    finally:
        http.close()


def _slot_owner(cluster: ClusterGroup, key: str) -> list[int]:
    return [n.port for n in cluster.nodes if redis_command(n.port, "EXISTS", key).startswith(":1")]


def test_cluster_sessions_through_the_sidecar(redis_cluster: ClusterGroup, sidecar_factory):
    """Explicit and inferred sessions, lifecycle, admin config and decisions on a 3-master
    cluster: every script's keys share the deployment's hash slot, nothing raises CROSSSLOT."""
    sidecar = sidecar_factory(redis_url=redis_cluster.url, redis_cluster=True)
    with httpx.Client(base_url=sidecar.url, timeout=10) as http:
        for turn in range(3):
            reply = http.post(CHAT, json=_chat(f"t{turn}"), headers={"X-Tenure-Session": "alpha"})
            assert reply.status_code == 200
        # No session header: inferred from message-prefix hashes (keys built inside the script).
        first = [{"role": "user", "content": "infer me"}]
        assert http.post(CHAT, json={"model": "echo", "messages": first}).is_success
        second = [
            *first,
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "more"},
        ]
        assert http.post(CHAT, json={"model": "echo", "messages": second}).is_success
        wait_for(lambda: http.get("/v1/sessions/alpha").json()["state"] == "idle", timeout_s=10)
        assert http.get("/v1/sessions/alpha").json()["turn"] == 3
        assert (
            http.post("/v1/sessions/alpha/suspend", json={"expected_wait_s": 60}).status_code == 200
        )
        assert http.post("/v1/sessions/alpha/resume").status_code == 200
        assert http.post("/v1/sessions/alpha/end").status_code == 200
        assert http.get("/v1/sessions/alpha").json()["state"] == "finished"
        listed = http.get("/v1/sessions").json()
        assert any(s["turn"] >= 2 for s in listed["sessions"])  # the inferred session, two turns
        admin = {"Authorization": "Bearer test-admin-token"}
        patched = http.patch("/admin/config", json={"host_slots": 99}, headers=admin)
        assert patched.status_code == 200 and patched.json()["host_slots"] == 99
        decisions = http.get("/admin/decisions", headers=admin).json()["decisions"]
        assert decisions
    # Every key lives on one master, in the slot of the hash tag.
    client = redis.RedisCluster.from_url(redis_cluster.url)
    try:
        keys = [
            k.decode() if isinstance(k, bytes) else k
            for k in client.keys("{tenure}:*", target_nodes=redis.RedisCluster.ALL_NODES)
        ]
        assert any(k.startswith("{tenure}:s:default:alpha") for k in keys)
        assert {client.keyslot(k) for k in keys} == {client.keyslot("{tenure}")}
        assert len({tuple(_slot_owner(redis_cluster, k)) for k in keys}) == 1
        assert client.keys("tenure:*", target_nodes=redis.RedisCluster.ALL_NODES) == []
    finally:
        client.close()


def test_cluster_store_reads(redis_cluster: ClusterGroup):
    """The store's pipelines and transactions (decision table, wait samples, config WATCH)
    on a cluster client."""

    async def run() -> None:
        topology = RedisTopology(url=redis_cluster.url, cluster=True)
        client = connect(topology, socket_timeout_s=2, connect_timeout_s=2)
        store = StateStore(client, Keys.build("ct", hash_tag=True), Breaker(1.0), StoreLimits())
        try:
            assert await store.add_wait_samples([1.0, 2.0]) == 2
            assert await store.float_samples("calibration_waits", 10) == [2.0, 1.0]
            updated = await store.update_config(lambda doc: {**(doc or {}), "n": 1})
            assert updated == {"n": 1}
            seq, table = await store.decision_table()
            assert seq == 0 and table == []
            assert await store.gap_log_head("default") == (0, "")
            assert await store.ping()
        finally:
            await store.aclose()
            await client.aclose()

    asyncio.run(run())


def test_migrate_keys_to_the_hash_tagged_layout(redis_url: str, sidecar_factory):
    """Sessions written in the plain layout are read by a hash-tagged sidecar after
    ``migrate-keys`` (inference keys listed in a record follow), and a second run is a no-op."""
    from tenure.service.state.migrate import migrate_keys

    plain = sidecar_factory()
    first = [{"role": "user", "content": "migrate me"}]
    with httpx.Client(base_url=plain.url, timeout=10) as http:
        assert http.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "kept"}).is_success
        assert http.post(CHAT, json={"model": "echo", "messages": first}).is_success
        wait_for(lambda: http.get("/v1/sessions/kept").json()["state"] == "idle", timeout_s=10)
        assert http.post("/v1/sessions/kept/suspend", json={"expected_wait_s": 60}).is_success
    plain.stop()
    client = redis.Redis.from_url(redis_url)
    try:
        dry = migrate_keys(client, "tenure", to_hash_tag=True, dry_run=True)
        assert dry.renamed > 0 and client.keys("{tenure}:*") == []
        report = migrate_keys(client, "tenure", to_hash_tag=True)
        assert report.renamed == dry.renamed and report.records_rewritten == 1
        assert not report.conflicts and client.keys("tenure:*") == []
        assert migrate_keys(client, "tenure", to_hash_tag=True).renamed == 0
    finally:
        client.close()
    tagged = sidecar_factory(redis_hash_tag=True)
    with httpx.Client(base_url=tagged.url, timeout=10) as http:
        assert http.get("/v1/sessions/kept").json()["state"] == "suspended"
        # The inferred session is found again from its prefix key, in the new layout.
        second = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "on"}]
        assert http.post(CHAT, json={"model": "echo", "messages": second}).is_success
        listed = http.get("/v1/sessions").json()["sessions"]
        wait_for(
            lambda: any(s["turn"] == 2 for s in http.get("/v1/sessions").json()["sessions"]),
            timeout_s=10,
        )
        assert len(listed) == 2
