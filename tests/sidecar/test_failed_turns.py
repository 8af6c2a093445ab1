"""A request the engine refuses is not a turn (issue 9, item 6).

An error answer (404 unknown model, 400 too long), an unreachable engine or a client gone
before the answer takes the turn back in Redis, on the exact path and on the early-forward
path (where Redis counts the turn while the request is already upstream), and a request
carrying ``X-Tenure-Last-Turn`` that fails never finishes its session nor pushes a
``finished`` decision: the harness can retry and the engine keeps the session's KV.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from tenure.service.wire.push import Decision, Hello, Snapshot
from tests.conftest import wait_for
from tests.sidecar.fake_upstream import free_port
from tests.sidecar.test_push import Peer

CHAT = "/v1/chat/completions"
ADMIN = {"Authorization": "Bearer test-admin-token"}


def _chat(model: str = "echo", **extra):
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def _record(http: httpx.Client, session: str) -> dict[str, Any]:
    record: dict[str, Any] = http.get(f"/v1/sessions/{session}").json()
    return record


def _settled(http: httpx.Client, session: str, state: str = "idle") -> dict[str, Any]:
    return wait_for(lambda: (r := _record(http, session))["state"] == state and r)


def _ended(http: httpx.Client, session: str) -> dict[str, Any]:
    """The record once the turn in flight is over (taken back, or ended)."""

    def over() -> dict[str, Any]:
        record = _record(http, session)
        return record if record.get("state") != "active" else {}

    return wait_for(over)


def _decisions(http: httpx.Client, session: str) -> list[dict[str, Any]]:
    found = http.get("/admin/decisions", headers=ADMIN).json()["decisions"]
    return [d for d in found if d["session_id"] == f"default/{session}"]


def _failed_turns(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith('tenure_failed_turns_total{taken_back="yes"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture
def pushed(sidecar_factory):
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=60)
    peer = Peer(addr)
    peer.send(Hello(adapter_id="engine-0"))
    peer.receive(Snapshot)
    try:
        yield server, peer
    finally:
        peer.close()


@pytest.mark.parametrize("early_forward", [True, False])
@pytest.mark.parametrize("model", ["missing", "error"])
def test_a_refused_request_is_not_a_turn(upstream, sidecar_factory, early_forward, model):
    fake, _ = upstream
    server = sidecar_factory(early_forward=early_forward)
    headers = {"X-Tenure-Session": "s"}
    with httpx.Client(base_url=server.url) as http:
        for _ in range(2):
            assert http.post(CHAT, json=_chat(), headers=headers).status_code == 200
        before = _settled(http, "s")
        assert before["turn"] == 2
        reply = http.post(CHAT, json=_chat(model), headers=headers)
        assert reply.status_code in (400, 404)
        # Forwarded as turn 3 (early: the forecast; exact: Redis's count)...
        assert fake.received[-1].body["kv_transfer_params"]["tenure"]["turn"] == 3
        after = _ended(http, "s")
        # ...and taken back: the record is as it was.
        for field in ("turn", "state", "last_activity", "expected_gap_s", "wakeup_at"):
            assert after[field] == before[field], field
        assert _failed_turns(http) == 1.0
        # The retry is turn 3, and the forecast agrees with Redis (no wrong turn).
        assert http.post(CHAT, json=_chat(), headers=headers).status_code == 200
        assert fake.received[-1].body["kv_transfer_params"]["tenure"]["turn"] == 3
        assert _settled(http, "s")["turn"] == 3
        assert 'tenure_early_forwards_total{outcome="wrong_turn"} 0.0' in http.get("/metrics").text


def test_a_failed_last_turn_never_finishes_the_session(upstream, pushed):
    server, peer = pushed
    last = {"X-Tenure-Session": "fin", "X-Tenure-Last-Turn": "true"}
    with httpx.Client(base_url=server.url) as http:
        assert http.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "fin"}).is_success
        _settled(http, "fin")
        assert [peer.receive(Decision).state for _ in range(2)] == ["active", "idle"]
        for model in ("missing", "error"):
            assert http.post(CHAT, json=_chat(model), headers=last).status_code >= 400
            record = _ended(http, "fin")
            assert (record["state"], record["turn"], record["last_turn"]) == ("idle", 1, False)
        wait_for(lambda: _failed_turns(http) == 2.0)
        assert [d["state"] for d in _decisions(http, "fin")] == ["idle", "active"]
        # Nothing went to the engine: no "finished", and no early "last turn" either.
        with pytest.raises(AssertionError):
            peer.receive(Decision, timeout_s=0.5)
        # The retry that succeeds does finish it.
        assert http.post(CHAT, json=_chat(), headers=last).status_code == 200
        finished = peer.receive(Decision)
        assert (finished.state, finished.last_turn, finished.turn) == ("finished", True, 2)
        assert _settled(http, "fin", "finished")["turn"] == 2


def test_an_unreachable_engine_or_a_client_gone_is_not_a_turn(sidecar_factory, upstream):
    dead = sidecar_factory(upstream_url=f"http://127.0.0.1:{free_port()}")
    headers = {"X-Tenure-Session": "u", "X-Tenure-Last-Turn": "1"}
    with httpx.Client(base_url=dead.url) as http:
        assert http.post(CHAT, json=_chat(), headers=headers).status_code == 502
        record = _ended(http, "u")
        assert (record["state"], record["turn"], record["last_turn"]) == ("idle", 0, False)
        assert _failed_turns(http) == 1.0
    live = sidecar_factory()
    gone = {**headers, "X-Tenure-Session": "gone"}
    with httpx.Client(base_url=live.url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post(CHAT, json=_chat("hang"), headers=gone)
    with httpx.Client(base_url=live.url) as http:
        record = _ended(http, "gone")
        assert (record["state"], record["turn"], record["last_turn"]) == ("idle", 0, False)
        assert _decisions(http, "gone")[0]["state"] != "finished"
        assert _failed_turns(http) == 1.0


def test_a_cut_stream_is_taken_back_and_never_finishes(upstream, client):
    """Issue 24: a harness retries a cut stream at once, so the cut turn is taken back and
    the retry is the same turn (it was counted, with a 30 s "other" gap, before)."""
    headers = {"X-Tenure-Session": "cut", "X-Tenure-Last-Turn": "true"}
    with client.stream("POST", CHAT, json=_chat("die", stream=True), headers=headers) as reply:
        assert reply.status_code == 200
        b"".join(reply.iter_raw())
    record = _ended(client, "cut")
    assert (record["state"], record["turn"]) == ("idle", 0)
    assert all(d["state"] != "finished" for d in _decisions(client, "cut"))


def test_a_failed_turn_of_a_suspended_session_leaves_it_suspended(upstream, pushed, redis_url):
    server, peer = pushed
    headers = {"X-Tenure-Session": "sus"}
    db = redis.Redis.from_url(redis_url)
    with httpx.Client(base_url=server.url) as http:
        assert http.post(CHAT, json=_chat(), headers=headers).is_success
        _settled(http, "sus")
        suspended = http.post("/v1/sessions/sus/suspend", json={"expected_wait_s": 600}).json()
        waits = db.llen("tenure:waits")
        ttl = db.ttl("tenure:s:default:sus")
        assert [peer.receive(Decision).state for _ in range(3)] == ["active", "idle", "suspended"]
        assert http.post(CHAT, json=_chat("missing"), headers=headers).status_code == 404
        record = _ended(http, "sus")
        for field in (
            "state", "turn", "suspended_at", "wakeup_at", "host_ttl_s", "expected_wait_s"
        ):  # fmt: skip
            assert record[field] == suspended[field], field
        # Leaving suspension was pushed at once ("active"); taking the turn back pushes the
        # suspension again, so the engine keeps the host copy's TTL timer.
        assert peer.receive(Decision).state == "active"
        again = peer.receive(Decision)
        assert (again.state, again.wakeup_at) == ("suspended", suspended["wakeup_at"])
        assert db.llen("tenure:waits") == waits  # the wait sample of the failed turn is gone
        assert abs(db.ttl("tenure:s:default:sus") - ttl) <= 2
        # Resuming for real still works and counts its wait once.
        assert http.post(CHAT, json=_chat(), headers=headers).is_success
        assert _settled(http, "sus")["turn"] == 2
        assert db.llen("tenure:waits") == waits + 1


def test_a_turn_that_another_turn_overtook_stays_counted(upstream, sidecar, redis_url):
    """Only the session's current turn is taken back: a later turn is never undone."""
    import threading

    db = redis.Redis.from_url(redis_url)
    headers = {"X-Tenure-Session": "par"}
    with httpx.Client(base_url=sidecar.url, timeout=10) as http:
        assert http.post(CHAT, json=_chat(), headers=headers).is_success
        _settled(http, "par")

        def give_up() -> None:  # turn 2: the client leaves before the engine answers
            with (
                httpx.Client(base_url=sidecar.url, timeout=1.0) as impatient,
                pytest.raises(httpx.ReadTimeout),
            ):
                impatient.post(CHAT, json=_chat("hang"), headers=headers)

        leaving = threading.Thread(target=give_up)
        leaving.start()
        wait_for(lambda: db.hget("tenure:s:default:par", "turn") == b"2")
        assert http.post(CHAT, json=_chat(), headers=headers).is_success  # turn 3, done
        leaving.join()
        wait_for(
            lambda: 'tenure_failed_turns_total{taken_back="no"} 1.0' in http.get("/metrics").text
        )
        record = _settled(http, "par")
        assert record["turn"] == 3
