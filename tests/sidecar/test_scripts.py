"""The two Lua scripts through :class:`StateStore`, against a real redis-server."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aioredis

from tenure.service.state.breaker import Breaker
from tenure.service.state.keys import Keys
from tenure.service.state.records import SessionUpdate, StoreLimits
from tenure.service.state.store import StateStore
from tenure.service.wire.decision_codec import decision_parts, decode_decision
from tenure.service.wire.push import Decision


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[StateStore]:
    client = aioredis.Redis.from_url(redis_url)
    s = StateStore(client, Keys("t"), Breaker(1.0), StoreLimits(session_ttl_s=600))
    try:
        yield s
    finally:
        await s.aclose()
        await client.aclose()


def _decision(session: str, state: str = "active", **kw: object) -> Decision:
    return Decision(seq=0, session_id=session, state=state, **kw)  # type: ignore[arg-type]


async def _start(store: StateStore, session: str, segment: str | None, now: float) -> int:
    start = await store.turn_start(
        "a", session=session, prefix_digests=[], new_session_id="", segment=segment,
        parent=None, last_turn=False, decision=_decision(""), now=now,
    )  # fmt: skip
    return start.turn


def test_decision_parts_join_back_to_the_decision_with_any_seq() -> None:
    decision = _decision("a/s-1", reason='a "quoted" seq":0 reason', expected_gap_s=1.5)
    head, tail = decision_parts(decision)
    for seq in (1, 42, 10**12):
        joined = decode_decision(head + str(seq).encode() + tail)
        assert joined == msgspec.structs.replace(decision, seq=seq)
    with pytest.raises(ValueError, match="seq is 0"):
        decision_parts(msgspec.structs.replace(decision, seq=3))


async def test_segments_are_listed_once_each_in_first_seen_order(store: StateStore) -> None:
    for now, segment in enumerate(["main", None, "tools", "main", "m", "tools.x"], start=1):
        await _start(store, "s", segment, float(now))
    record = await store.get_session("a", "s")
    assert record is not None
    # "m" is a prefix of "main" and "tools" of "tools.x": each is still its own segment.
    assert json.loads(record.fields["segments"]) == ["main", "tools", "m", "tools.x"]
    assert record.fields["turn"] == "6" and record.fields["version"] == "6"


async def test_segment_list_stops_growing_at_256(store: StateStore) -> None:
    for i in range(260):
        await _start(store, "wide", f"seg{i}", float(i + 1))
    record = await store.get_session("a", "wide")
    assert record is not None
    assert json.loads(record.fields["segments"]) == [f"seg{i}" for i in range(256)]


async def test_apply_writes_fields_deletes_fields_and_publishes_with_the_next_seq(
    store: StateStore,
) -> None:
    turn = await _start(store, "s", "main", 1.0)
    update = SessionUpdate(
        fields={"state": "idle", "wakeup_at": "9.5", "reason": 'r|x "q"'},
        deleted=["host_ttl_s", "never_set"],
        live_score=9.5,
        decision=_decision("a/s", "idle", turn=turn, expected_gap_s=8.5, wakeup_at=9.5),
    )
    status, seq = await store.apply("a", "s", update, now=1.0, guard=("turn", str(turn)))
    assert status == 1 and seq >= 1
    record = await store.get_session("a", "s")
    assert record is not None
    assert record.fields["state"] == "idle" and record.fields["reason"] == 'r|x "q"'
    assert record.fields["version"] == "2" and "host_ttl_s" not in record.fields
    newest, table = await store.decision_table()
    assert newest == seq
    assert update.decision is not None
    assert table[-1] == msgspec.structs.replace(update.decision, seq=seq)
    entries = await store.read_decisions("0", block_ms=0)
    assert entries[-1][1].seq == seq
    # The turn guard: a stale turn number changes nothing.
    stale = SessionUpdate(fields={"state": "finished"}, live_score=None)
    assert await store.apply("a", "s", stale, now=2.0, guard=("turn", "0")) == (0, 0)
    assert await store.apply("a", "gone", stale, now=2.0, guard=("turn", "1")) == (-1, 0)
    record = await store.get_session("a", "s")
    assert record is not None and record.fields["state"] == "idle"


async def test_a_turn_clears_what_the_pause_before_it_left(store: StateStore) -> None:
    turn = await _start(store, "s", None, 1.0)
    pause = SessionUpdate(
        fields={"state": "suspended", "suspended_at": "2.0", "host_ttl_s": "30.0"},
        live_score=float("inf"),
    )
    assert (await store.apply("a", "s", pause, now=2.0, guard=("turn", str(turn))))[0] == 1
    await _start(store, "s", None, 5.0)
    record = await store.get_session("a", "s")
    assert record is not None
    assert record.fields["state"] == "active" and record.fields["turn"] == "2"
    assert "suspended_at" not in record.fields and "host_ttl_s" not in record.fields


async def test_decision_table_entries_of_expired_sessions_are_swept(store: StateStore) -> None:
    # Session "old" expires at now + ttl = 70; decisions published later sweep it out of the
    # snapshot table (every 32nd decision sweeps).
    old = SessionUpdate(fields={"state": "idle"}, live_score=1.0, ttl_s=60,
                        decision=_decision("a/old", "idle"))  # fmt: skip
    assert (await store.create_session("a", "old", old, now=10.0)) >= 1
    for i in range(40):
        update = SessionUpdate(fields={"state": "idle"}, live_score=1.0,
                               decision=_decision(f"a/n{i}", "idle"))  # fmt: skip
        await store.create_session("a", f"n{i}", update, now=100.0 + i)
    _, table = await store.decision_table()
    assert "a/old" not in {d.session_id for d in table}
    assert len(table) == 40
