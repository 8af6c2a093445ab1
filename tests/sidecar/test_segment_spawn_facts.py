"""What the live sidecar gives the worker ranker at spawn: the replay's facts, end to end.

A real sidecar (its own clock, stepped by the test) in front of the fake vLLM, real Redis.
The ranker is a recording one (it implements ``WorkerRanker``), so each spawn's
:class:`~tenure.service.policy.ranker.SpawnRecord` is seen exactly as the model would see it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

import tenure.service.app
from tenure.service.app import create_app
from tenure.service.policy.ranker import SpawnRecord
from tenure.service.settings import Settings, TenantSpec
from tests.conftest import wait_for
from tests.sidecar.conftest import ADMIN_TOKEN
from tests.sidecar.fake_upstream import ServerThread, prompt_tokens
from tests.sidecar.test_segments import assistant, chat, state_of, user

PREFIX = "tenure"


class RecordingRanker:
    """A :class:`~tenure.service.policy.ranker.WorkerRanker` that keeps what it was asked."""

    name = "recording"

    def __init__(self) -> None:
        self.records: list[SpawnRecord] = []

    def predict_lifetime_s(self, record: SpawnRecord) -> float:
        self.records.append(record)
        return 100.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def live(redis_url: str, upstream, monkeypatch) -> Iterator[tuple[Any, ...]]:
    """(http client, recording ranker, clock, settings overrides hook) for one sidecar."""
    ranker = RecordingRanker()
    monkeypatch.setattr(tenure.service.app, "load_ranker", lambda _path: ranker)
    clock = Clock(1000.0)
    _fake, up = upstream
    started: list[ServerThread] = []

    def start(**overrides: Any) -> httpx.Client:
        values: dict[str, Any] = {
            "redis_url": redis_url, "upstream_url": up.url, "admin_token": ADMIN_TOKEN,
            "push_addr": "", "refresh_interval_s": 0.2, "upstream_read_timeout_s": 5.0,
            "segments": True, **overrides,
        }  # fmt: skip
        server = ServerThread(create_app(Settings(**values), clock=clock)).start()
        started.append(server)
        return httpx.Client(base_url=server.url, timeout=10)

    try:
        yield start, ranker, clock
    finally:
        for server in started:
            server.stop()


def recorded(redis_url: str, session: str, turn: int) -> None:
    wait_for(lambda: (state_of(redis_url, "default", session) or {}).get("turn") == turn)


def test_a_third_spawn_sees_the_parents_call_and_its_earlier_workers(live, redis_url):
    start, ranker, clock = live
    http = start()
    history: list[Any] = [user(1)]

    # The parent's first call answers a human; a reasoning model answers it.
    first = chat(http, "P", history)
    assert first.status_code == 200
    recorded(redis_url, "P", 1)

    # Two workers: one by its first request naming the parent, one through the API.
    clock.now = 1010.0
    assert chat(http, "w1", [user(5)], model="echo", **{"X-Tenure-Parent": "P"}).status_code == 200
    recorded(redis_url, "w1", 1)
    clock.now = 1011.0
    spawned = http.post("/v1/sessions/P/workers", json={"worker_id": "w2"})
    assert spawned.status_code == 201, spawned.text
    one, two = ranker.records
    assert (one.workers_before, one.sibling_index, one.fanout) == (0, 0, 1)
    assert (two.workers_before, two.sibling_index, two.fanout) == (1, 1, 2)
    assert one.parent_gap_s == 0.0 and one.session_elapsed_s == pytest.approx(10.0)
    assert one.parent_human_turn and one.parent_thinking and one.parent_output_tokens == 54

    # w1 returns after 90 s; then the parent answers a new human message 150 s after its
    # first answer ended, and spawns a third worker.
    clock.now = 1100.0
    assert http.post("/v1/sessions/w1/return").status_code == 200
    clock.now = 1150.0
    history += [assistant(first.json(), keep_reasoning=False), user(2)]
    assert chat(http, "P", history).status_code == 200
    recorded(redis_url, "P", 2)
    clock.now = 1200.0
    assert chat(http, "w3", [user(6)], model="echo", **{"X-Tenure-Parent": "P"}).status_code == 200
    third = ranker.records[2]
    assert (third.workers_before, third.workers_returned) == (2, 1)
    assert third.returned_mean_lifetime_s == pytest.approx(90.0)
    assert third.parent_turn == 1  # the parent's second call (0-based, as the replay counts)
    assert third.parent_output_tokens == 54  # 40 reasoning + 12 content + 2 markers
    assert third.parent_context_tokens == prompt_tokens(history) + 54
    assert third.parent_thinking and third.parent_human_turn
    assert third.parent_gap_s == pytest.approx(150.0)
    assert third.session_elapsed_s == pytest.approx(200.0)
    assert (third.sibling_index, third.fanout) == (0, 1)  # a new call: a new fan-out

    # w3's request marked as its last turn is its return (50 s); the parent's next call
    # answers a tool result with no reasoning; the fourth worker sees both returns.
    recorded(redis_url, "w3", 1)
    clock.now = 1250.0
    last = chat(http, "w3", [user(6)], model="echo", **{"X-Tenure-Last-Turn": "true"})
    assert last.status_code == 200
    wait_for(lambda: (state_of(redis_url, "default", "w3") or {}).get("returned") is True)
    clock.now = 1320.0
    history += [
        {"role": "assistant", "content": "running", "tool_calls": []},
        {"role": "tool", "tool_call_id": "call_1", "content": "all tests pass"},
    ]
    assert chat(http, "P", history, model="echo").status_code == 200
    recorded(redis_url, "P", 3)
    clock.now = 1330.0
    assert http.post("/v1/sessions/P/workers", json={"worker_id": "w4"}).status_code == 201
    fourth = ranker.records[3]
    assert (fourth.workers_before, fourth.workers_returned) == (3, 2)
    assert fourth.returned_mean_lifetime_s == pytest.approx(math.sqrt(90.0 * 50.0))
    assert not fourth.parent_thinking and not fourth.parent_human_turn
    assert fourth.parent_output_tokens == 3 and fourth.parent_turn == 2
    assert fourth.parent_gap_s == pytest.approx(1320.0 - 1150.0)

    # The parent's history is a bounded hash beside its state, gone when the lead ends.
    client = redis.Redis.from_url(redis_url)
    key = f"{PREFIX}:segw:default:P"
    assert client.hlen(key) == 5 + 4 and client.ttl(key) > 0  # 5 counters, 4 workers
    assert http.post("/v1/sessions/P/end").status_code == 200
    wait_for(lambda: not client.exists(key))


def test_a_first_request_retried_counts_its_spawn_once(live, redis_url, upstream):
    """A worker is counted at its first request, once: a refused first request (the
    upstream's 400) and its retry are one spawn, the retry in its first place."""
    start, ranker, _clock = live
    http = start()
    assert chat(http, "P", [user(1)], model="echo").status_code == 200
    recorded(redis_url, "P", 1)
    refused = chat(http, "w", [user(2)], model="error", **{"X-Tenure-Parent": "P"})
    assert refused.status_code == 400
    assert chat(http, "w", [user(2)], model="echo", **{"X-Tenure-Parent": "P"}).status_code == 200
    recorded(redis_url, "w", 1)
    assert http.post("/v1/sessions/P/workers", json={"worker_id": "v"}).status_code == 201
    assert [r.workers_before for r in ranker.records] == [0, 0, 1]


def test_one_tenants_spawns_never_touch_anothers_parent(live, redis_url):
    start, ranker, _clock = live
    http = start(tenants={"key-a": TenantSpec(name="alpha"), "key-b": TenantSpec(name="beta")})
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    for key in (a, b):
        assert chat(http, "P", [user(1)], model="echo", **key).status_code == 200

    def has_turn(tenant: str) -> bool:
        return (state_of(redis_url, tenant, "P") or {}).get("turn") == 1

    wait_for(lambda: has_turn("alpha") and has_turn("beta"))
    for worker in ("b1", "b2"):
        spawn = http.post("/v1/sessions/P/workers", json={"worker_id": worker}, headers=b)
        assert spawn.status_code == 201
        assert http.post(f"/v1/sessions/{worker}/return", headers=b).status_code == 200
    assert (
        http.post("/v1/sessions/P/workers", json={"worker_id": "a1"}, headers=a).status_code == 201
    )
    assert [(r.workers_before, r.workers_returned) for r in ranker.records] == [
        (0, 0), (1, 1), (0, 0),
    ]  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    assert client.hget(f"{PREFIX}:segw:beta:P", "n") == b"2"
    assert client.hget(f"{PREFIX}:segw:alpha:P", "n") == b"1"


def test_a_parallel_fan_out_counts_every_sibling_once(live, redis_url):
    """Siblings' first requests arrive together (a harness's parallel tool calls): the
    atomic count gives each its own place, none lost."""
    start, ranker, _clock = live
    http = start()
    assert chat(http, "P", [user(1)], model="echo").status_code == 200
    recorded(redis_url, "P", 1)
    workers = [f"f{i}" for i in range(6)]
    with ThreadPoolExecutor(len(workers)) as pool:
        codes = list(
            pool.map(
                lambda w: chat(http, w, [user(2)], model="echo", **{"X-Tenure-Parent": "P"}),
                workers,
            )
        )
    assert [c.status_code for c in codes] == [200] * len(workers)
    assert sorted(r.workers_before for r in ranker.records) == list(range(len(workers)))
    assert sorted(r.sibling_index for r in ranker.records) == list(range(len(workers)))
    client = redis.Redis.from_url(redis_url)
    assert client.hget(f"{PREFIX}:segw:default:P", "n") == str(len(workers)).encode()


def test_the_worker_history_on_a_cluster(live, redis_cluster):
    """On a 3-master cluster (keys hash-tagged) the state, the history and their scripts
    share one slot: nothing raises CROSSSLOT (which would fail open, silently)."""
    start, ranker, clock = live
    http = start(redis_url=redis_cluster.url, redis_cluster=True)
    assert chat(http, "P", [user(1)], model="echo").status_code == 200
    client = redis.RedisCluster.from_url(redis_cluster.url)
    try:

        def state() -> dict[str, Any] | None:
            raw = client.get("{tenure}:seg:default:P")
            return None if raw is None else dict(json.loads(raw))

        wait_for(lambda: (state() or {}).get("turn") == 1)
        assert (
            chat(http, "w1", [user(2)], model="echo", **{"X-Tenure-Parent": "P"}).status_code == 200
        )
        clock.now += 30.0
        assert http.post("/v1/sessions/w1/return").status_code == 200
        assert http.post("/v1/sessions/P/workers", json={"worker_id": "w2"}).status_code == 201
        last = ranker.records[-1]
        assert (last.workers_before, last.workers_returned) == (1, 1)
        assert last.returned_mean_lifetime_s == pytest.approx(30.0)
        assert client.hget("{tenure}:segw:default:P", "n") == b"2"
    finally:
        client.close()


def test_an_older_answers_late_write_never_puts_the_session_back_a_turn(
    live, redis_url, monkeypatch
):
    """On a loaded machine a request can stop waiting for the previous answer's record
    (``RECORD_WAIT_S``) and its own answer's record can then be written first; the older
    write must not land after it. It did: a replayed parent's spawn read the parent three
    turns behind (``parent_turn`` 220 for 223) in a clean-clone run beside a ladder."""
    import asyncio
    import threading

    from tenure.service.api.segments import tracker
    from tenure.service.state.segment_store import SegmentStore

    monkeypatch.setattr(tracker, "RECORD_WAIT_S", 0.05)  # the wait a busy machine outran
    real_put = SegmentStore.put
    slow_done = threading.Event()

    async def slow_put(self: SegmentStore, tenant: str, session: str, raw: bytes, ttl: int) -> None:
        slow = session == "P" and json.loads(raw)["turn"] == 1
        if slow:
            await asyncio.sleep(0.5)
        await real_put(self, tenant, session, raw, ttl)
        if slow:
            slow_done.set()

    monkeypatch.setattr(SegmentStore, "put", slow_put)
    start, ranker, clock = live
    http = start()
    history: list[Any] = [user(1)]
    first = chat(http, "P", history)
    assert first.status_code == 200
    history += [assistant(first.json(), keep_reasoning=False), user(2)]
    assert chat(http, "P", history).status_code == 200
    wait_for(slow_done.is_set)
    # Turn 2's record is the last word on P whichever write finished first.
    wait_for(lambda: (state_of(redis_url, "default", "P") or {}).get("turn") == 2)
    clock.now = 1010.0
    assert http.post("/v1/sessions/P/workers", json={"worker_id": "w1"}).status_code == 201
    assert ranker.records[-1].parent_turn == 1  # the parent's second call, 0-based
