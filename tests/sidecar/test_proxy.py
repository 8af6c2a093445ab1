"""The proxy against a real upstream HTTP server and a real Redis."""

from __future__ import annotations

import json
import re

import httpx
import pytest
import redis

from tests.conftest import wait_for

CHAT = "/v1/chat/completions"


def _chat(model: str = "echo", **extra):
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def test_plain_request_is_passed_through_and_nothing_stored(upstream, sidecar, redis_url):
    """No hints and no messages to infer from: forward unchanged, store nothing."""
    fake, _ = upstream
    with httpx.Client(base_url=sidecar.url) as http:
        reply = http.post("/v1/completions", json={"model": "echo", "prompt": "x"})
    assert reply.status_code == 200
    assert reply.json()["choices"][0]["finish_reason"] == "stop"
    assert fake.received[-1].body == {"model": "echo", "prompt": "x"}
    assert redis.Redis.from_url(redis_url).keys("tenure:s:*") == []


def test_header_hints_reach_upstream_in_kv_transfer_params(upstream, client):
    """Hints by header: kv_transfer_params.tenure carries the scoped session and turn."""
    fake, _ = upstream
    headers = {"X-Tenure-Session": "s1", "X-Tenure-Segment": "main", "X-Tenure-Last-Turn": "no"}
    for expected_turn in (1, 2):
        reply = client.post(CHAT, json=_chat(), headers=headers)
        assert reply.status_code == 200
        sent = fake.received[-1]
        tenure = sent.body["kv_transfer_params"]["tenure"]
        assert tenure["session_id"] == "default/s1"
        assert tenure["turn"] == expected_turn
        assert tenure["segment"] == "main"
        assert not any(h.startswith("x-tenure") for h in sent.headers)


def test_body_hints_removed_and_client_kv_params_merged(upstream, client):
    """A `tenure` body object is stripped; the client's own kv_transfer_params survive."""
    fake, _ = upstream
    body = _chat(
        tenure={"session": "s2", "expected_gap_ms": 2500, "parent": "lead"},
        kv_transfer_params={"do_remote_prefill": False},
    )
    reply = client.post(CHAT, json=body)
    assert reply.status_code == 200
    sent = fake.received[-1].body
    assert "tenure" not in sent
    assert sent["kv_transfer_params"]["do_remote_prefill"] is False
    tenure = sent["kv_transfer_params"]["tenure"]
    assert tenure["session_id"] == "default/s2"
    assert tenure["parent"] == "default/lead"
    assert tenure["expected_gap_s"] == pytest.approx(2.5)


def test_streaming_is_relayed_chunk_by_chunk_and_turn_end_recorded(upstream, client):
    """SSE bytes arrive unchanged; the stream's finish_reason decides the session's next state."""
    with client.stream(
        "POST", CHAT, json=_chat("tool", stream=True), headers={"X-Tenure-Session": "st"}
    ) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        body = b"".join(reply.iter_raw())
    events = [line for line in body.split(b"\n\n") if line]
    assert events[-1] == b"data: [DONE]"
    assert len(events) == 5
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "tool_calls"

    def idle():
        record = client.get("/v1/sessions/st").json()
        return record if record["state"] == "idle" else None

    record = wait_for(idle)
    assert record["stop_reason"] == "tool_calls"
    assert record["tool"] == "run_tests"
    # Predicted from the tool prior (seconds, not the human-turn minutes).
    assert 0 < record["expected_gap_s"] < 60
    assert record["wakeup_at"] > record["last_activity"] - 1


def test_last_turn_finishes_the_session(upstream, client):
    headers = {"X-Tenure-Session": "fin", "X-Tenure-Last-Turn": "true"}
    assert client.post(CHAT, json=_chat(), headers=headers).status_code == 200
    record = wait_for(
        lambda: (r := client.get("/v1/sessions/fin").json())["state"] == "finished" and r
    )
    assert record["last_turn"] is True
    assert record["eviction_class"] == "finished"
    decisions = client.get(
        "/admin/decisions", headers={"Authorization": "Bearer test-admin-token"}
    ).json()["decisions"]
    reasons = [d["reason"] for d in decisions if d["session_id"] == "default/fin"]
    assert reasons[0] == "last_turn"


def test_upstream_error_status_and_body_kept(upstream, client):
    reply = client.post(CHAT, json=_chat("error"), headers={"X-Tenure-Session": "e1"})
    assert reply.status_code == 400
    assert reply.json() == {"error": {"message": "bad model", "type": "BadRequestError"}}
    # A failed turn still ends: the session does not stay "active".
    record = wait_for(lambda: (r := client.get("/v1/sessions/e1").json())["state"] == "idle" and r)
    assert record["stop_reason"] is None


def test_unreachable_upstream_gives_502(sidecar_factory, redis_url):
    from tests.sidecar.fake_upstream import free_port

    server = sidecar_factory(upstream_url=f"http://127.0.0.1:{free_port()}")
    with httpx.Client(base_url=server.url) as http:
        reply = http.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "u"})
    assert reply.status_code == 502
    assert reply.json()["error"]["code"] == "upstream_unreachable"


def test_timed_out_upstream_gives_504(sidecar_factory):
    server = sidecar_factory(upstream_read_timeout_s=0.3)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        reply = http.post(CHAT, json=_chat("slow"))
    assert reply.status_code == 504
    assert reply.json()["error"]["type"] == "upstream_timeout"


def test_client_disconnect_cancels_upstream(upstream, sidecar):
    """A client that goes away mid-stream makes the proxy drop the upstream request."""
    fake, _ = upstream
    with (
        httpx.Client(base_url=sidecar.url, timeout=10) as http,
        http.stream(
            "POST", CHAT, json=_chat("hang", stream=True), headers={"X-Tenure-Session": "h"}
        ) as reply,
    ):
        first = next(reply.iter_raw())
        assert first.startswith(b"data: ")
    # Leaving the block closed the client connection mid-stream.
    assert fake.cancelled.wait(5.0), "upstream never saw the disconnect"


def test_a_client_leaving_after_the_answers_end_had_the_whole_answer(upstream, sidecar):
    """A client that leaves once the finish reason went by, before the engine ended the stream
    (Codex's ``exec`` closes on ``response.completed``), got its whole answer: the turn counts
    as answered, so the last turn it declared ends the session. Cut before the finish reason,
    the same request leaves the session open (issue 23: under load the race went the client's
    way and a finished one-shot run was kept as a live session)."""
    fake, _ = upstream

    def stream_and_leave(model: str, session: str, lines: int) -> None:
        fake.cancelled.clear()
        headers = {"X-Tenure-Session": session, "X-Tenure-Last-Turn": "true"}
        with (
            httpx.Client(base_url=sidecar.url, timeout=10) as http,
            http.stream("POST", CHAT, json=_chat(model, stream=True), headers=headers) as reply,
        ):
            seen = 0
            for line in reply.iter_lines():
                seen += line.startswith("data: ")
                if seen == lines:
                    break
        assert fake.cancelled.wait(10.0), "upstream never saw the disconnect"

    def state(session: str) -> str:
        with httpx.Client(base_url=sidecar.url, timeout=10) as http:

            def settled() -> str:
                reply = http.get(f"/v1/sessions/{session}", headers={"X-Tenure-Session": session})
                found = reply.json().get("state") if reply.status_code == 200 else None
                return "" if found in (None, "active") else str(found)

            return wait_for(settled, timeout_s=10)

    stream_and_leave("linger", "whole", lines=4)  # three tokens, then the finish reason
    assert state("whole") == "finished"
    stream_and_leave("hang", "cut", lines=1)  # one chunk, no finish reason
    assert state("cut") != "finished"


def test_client_disconnect_before_the_answer_cancels_upstream(upstream, sidecar):
    """Not streaming: a client that gives up while the engine works drops the upstream call."""
    fake, _ = upstream
    with httpx.Client(base_url=sidecar.url, timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post(CHAT, json=_chat("hang"), headers={"X-Tenure-Session": "h2"})
    assert fake.cancelled.wait(5.0), "upstream never saw the disconnect"


def test_models_and_other_routes_pass_through(upstream, client):
    reply = client.get("/v1/models")
    assert reply.status_code == 200
    assert reply.json()["data"][0]["id"] == "echo"


def test_metrics_exposed_with_tenure_prefix(client):
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "m"})
    text = client.get("/metrics").text
    assert 'tenure_requests_total{route="chat",status="200"}' in text
    assert "tenure_sidecar_latency_seconds_bucket" in text
    assert 'tenure_decisions_total{kind="active",reason="request"}' in text


def test_sessions_by_state_gauge(client):
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "g1"})
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "g2"})
    client.post("/v1/sessions/g2/suspend", json={})

    def gauge():
        text = client.get("/metrics").text
        return 'tenure_sessions{state="idle"} 1.0' in text and (
            'tenure_sessions{state="suspended"} 1.0' in text
        )

    wait_for(gauge, timeout_s=5.0)


def _forecasts(metrics: str) -> dict[str, float]:
    found = re.findall(r'^tenure_early_forwards_total\{outcome="(\w+)"\} (\S+)$', metrics, re.M)
    # Non-zero outcomes only (all three series are exported from the start).
    return {outcome: float(value) for outcome, value in found if float(value)}


def test_early_forward_numbers_turns_as_redis_does_and_counts_its_forecasts(
    upstream, sidecar_factory
):
    """A replica forecasts turns of sessions it has seen; one wrong forecast sends it back."""
    fake, _ = upstream
    one, two = sidecar_factory(), sidecar_factory()
    headers = {"X-Tenure-Session": "ef"}

    def turn(http: httpx.Client) -> int:
        assert http.post(CHAT, json=_chat(), headers=headers).status_code == 200
        return int(fake.received[-1].body["kv_transfer_params"]["tenure"]["turn"])

    # Deadlines, not waits: each returns as soon as its condition holds (a shared CI machine
    # can stall the off-path Redis answer for seconds).
    with (
        httpx.Client(base_url=one.url, timeout=30) as a,
        httpx.Client(base_url=two.url, timeout=30) as b,
    ):
        # Turn 1 waits for Redis; 2-4 go upstream first and Redis confirms their numbers.
        assert [turn(a) for _ in range(4)] == [1, 2, 3, 4]
        # (Redis's answer may land just after the response: it is off the response path.)
        wait_for(lambda: _forecasts(a.get("/metrics").text) == {"confirmed": 3.0}, timeout_s=30.0)
        # Replica two counts turn 5, so replica one's next forecast (5) is wrong once (Redis
        # counts 6) and the session takes the exact path there from then on.
        assert turn(b) == 5
        assert turn(a) == 5
        wait_for(
            lambda: _forecasts(a.get("/metrics").text) == {"confirmed": 3.0, "wrong_turn": 1.0},
            timeout_s=30.0,
        )
        assert [turn(a) for _ in range(2)] == [7, 8]
        assert _forecasts(a.get("/metrics").text) == {"confirmed": 3.0, "wrong_turn": 1.0}
        # Redis's count, the record and the end-of-turn guard never used a forecast.
        # (A lifecycle read waits for the session's end-of-turn write: no polling needed.)
        record = a.get("/v1/sessions/ef").json()
        assert (record["state"], record["turn"]) == ("idle", 8)


def test_without_early_forward_every_turn_waits_for_redis(upstream, sidecar_factory):
    fake, _ = upstream
    exact = sidecar_factory(early_forward=False)
    with httpx.Client(base_url=exact.url) as http:
        for expected in (1, 2, 3):
            http.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "x"})
            assert fake.received[-1].body["kv_transfer_params"]["tenure"]["turn"] == expected
        assert _forecasts(http.get("/metrics").text) == {}
