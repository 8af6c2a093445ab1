"""Lifecycle routes, tenant isolation, session inference and bad hints, on a real Redis."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import redis

from tenure.service.settings import TenantSpec
from tests.conftest import poll, wait_for

CHAT = "/v1/chat/completions"
ADMIN = {"Authorization": "Bearer test-admin-token"}


def _chat(messages=None, model="echo", **extra):
    return {"model": model, "messages": messages or [{"role": "user", "content": "hi"}], **extra}


def _wait_state(client, session, state, headers=None, timeout_s=5.0):
    seen: list[dict[str, Any]] = []

    def reached():
        seen.append(client.get(f"/v1/sessions/{session}", headers=headers or {}).json())
        return seen[-1] if seen[-1].get("state") == state else None

    record = poll(reached, timeout_s)
    if record is None:
        raise AssertionError(f"session {session} never reached {state}: {seen[-1]}")
    return record


def test_suspend_resume_end_cycle(client):
    """Suspend records the wait and the core's host-TTL decision; resume yields a wait sample."""
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "life"})
    _wait_state(client, "life", "idle")
    suspended = client.post(
        "/v1/sessions/life/suspend", json={"reason": "approval", "expected_wait_s": 600}
    )
    assert suspended.status_code == 200
    body = suspended.json()
    assert body["state"] == "suspended"
    assert body["suspend_reason"] == "approval"
    assert body["expected_wait_s"] == 600
    assert body["wakeup_at"] == pytest.approx(body["suspended_at"] + 600, abs=1)
    # No congestion at the default price and a low suspension rate: retain on host.
    assert body["host_ttl_s"] is None
    assert body["reason"] == "host_retain"

    resumed = client.post("/v1/sessions/life/resume").json()
    assert resumed["state"] == "idle"
    assert resumed["reason"] == "resumed"
    assert resumed["suspended_at"] is None

    ended = client.post("/v1/sessions/life/end").json()
    assert ended["state"] == "finished"
    assert ended["eviction_class"] == "finished"
    assert client.post("/v1/sessions/life/suspend").status_code == 409

    decisions = client.get("/admin/decisions", headers=ADMIN).json()["decisions"]
    mine = [d for d in decisions if d["session_id"] == "default/life"]
    assert [d["state"] for d in mine[:3]] == ["finished", "idle", "suspended"]
    seqs = [d["seq"] for d in decisions]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)


def test_finished_sessions_expire(sidecar_factory, redis_url):
    server = sidecar_factory(finished_ttl_s=1)
    with httpx.Client(base_url=server.url) as http:
        http.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "short"})
        _wait_state(http, "short", "idle")
        assert http.post("/v1/sessions/short/end").status_code == 200
        ttl = redis.Redis.from_url(redis_url).ttl("tenure:s:default:short")
        assert 0 < ttl <= 1
        # Redis expires it within the second (a deadline, returning as soon as it is gone).
        wait_for(lambda: http.get("/v1/sessions/short").status_code == 404, timeout_s=10.0)


def test_host_ttl_under_congestion(client):
    """With a fixed lambda above lambda_crit the suspension gets the finite t2(lambda)."""
    patch = {"lambda_mode": "fixed", "lambda_fixed_per_s": 1.0, "host_slots": 10, "w_ref_s": 100}
    assert client.patch("/admin/config", json=patch, headers=ADMIN).status_code == 200
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "busy"})
    body = client.post("/v1/sessions/busy/suspend", json={}).json()
    # lambda_crit = 10/100 = 0.1/s; alpha2 = (1 - 0.1) * 1.91 / 10; t2 = (1.91 - 0.02) / alpha2
    expected = (1.91 - 0.02) / ((1.0 - 0.1) * 1.91 / 10)
    assert body["host_ttl_s"] == pytest.approx(expected, rel=1e-6)
    assert body["reason"] == "host_ttl"
    metrics = client.get("/metrics").text
    # The TTL given is exported per tenant (the global tenure_host_ttl_seconds of the dead
    # estimator is gone).
    assert 'tenure_retention_host_ttl_seconds{tenant="default"}' in metrics


def test_spawn_worker_links_parent_and_child(client):
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "lead"})
    spawned = client.post(
        "/v1/sessions/lead/workers",
        json={"worker_id": "lead.w1", "role": "reviewer", "metadata": {"task": "review"}},
    )
    assert spawned.status_code == 201
    worker = spawned.json()
    assert worker["parent"] == "lead"
    assert worker["role"] == "reviewer"
    assert client.get("/v1/sessions/lead").json()["workers"] == ["lead.w1"]
    assert client.get("/v1/sessions/lead.w1").json()["metadata"] == {"task": "review"}
    again = client.post("/v1/sessions/lead/workers", json={"worker_id": "lead.w1"})
    assert again.status_code == 409
    missing = client.post("/v1/sessions/nobody/workers", json={"worker_id": "x"})
    assert missing.status_code == 404


def test_list_sessions_orders_by_wakeup(client):
    for name, gap_ms in (("late", 90_000), ("soon", 1_000)):
        client.post(
            CHAT,
            json=_chat(),
            headers={"X-Tenure-Session": name, "X-Tenure-Expected-Gap-Ms": str(gap_ms)},
        )
        _wait_state(client, name, "idle")
    listed = client.get("/v1/sessions").json()["sessions"]
    assert [s["session_id"] for s in listed] == ["soon", "late"]
    assert client.get("/v1/sessions", params={"limit": 0}).status_code == 422


def test_tenants_are_isolated(sidecar_factory):
    """A session id is scoped by the caller's API key: no tenant reads or ends another's."""
    tenants = {
        "key-a": TenantSpec(name="acme"),
        "key-b": TenantSpec(name="bolt"),
    }
    server = sidecar_factory(tenants=tenants)
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    with httpx.Client(base_url=server.url) as http:
        assert (
            http.post(CHAT, json=_chat(), headers={**a, "X-Tenure-Session": "s"}).status_code == 200
        )
        _wait_state(http, "s", "idle", headers=a)
        assert http.get("/v1/sessions/s", headers=b).status_code == 404
        assert http.post("/v1/sessions/s/end", headers=b).status_code == 404
        assert http.get("/v1/sessions/s", headers=a).json()["state"] == "idle"
        assert http.get("/v1/sessions", headers=b).json()["sessions"] == []
        # Same id in the other tenant is a different session.
        http.post(CHAT, json=_chat(), headers={**b, "X-Tenure-Session": "s"})
        assert http.get("/v1/sessions/s", headers=b).json()["turn"] == 1
        assert http.get("/v1/sessions/s", headers=a).json()["turn"] == 1
        unknown = http.post(CHAT, json=_chat(), headers={"Authorization": "Bearer nope"})
        assert unknown.status_code == 401
        assert unknown.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/v1/sessions", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_session_inferred_from_message_prefixes(upstream, client):
    """Without a session header, a request extending an earlier one continues its session."""
    fake, _ = upstream
    first = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix bug 7"}]
    client.post(CHAT, json=_chat(first))
    sid1 = fake.received[-1].body["kv_transfer_params"]["tenure"]["session_id"]
    assert sid1.startswith("default/auto-")
    second = [
        *first,
        {"role": "assistant", "content": "patched"},
        {"role": "user", "content": "run tests"},
    ]
    client.post(CHAT, json=_chat(second))
    tenure = fake.received[-1].body["kv_transfer_params"]["tenure"]
    assert tenure["session_id"] == sid1
    assert tenure["turn"] == 2
    other = [{"role": "system", "content": "agent"}, {"role": "user", "content": "another task"}]
    client.post(CHAT, json=_chat(other))
    assert fake.received[-1].body["kv_transfer_params"]["tenure"]["session_id"] != sid1


def test_inference_switched_off_per_tenant(upstream, sidecar_factory):
    fake, _ = upstream
    server = sidecar_factory(tenants={"k": TenantSpec(name="plain", infer_sessions=False)})
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer k"}) as http:
        assert http.post(CHAT, json=_chat()).status_code == 200
    assert "kv_transfer_params" not in fake.received[-1].body


def test_gap_learned_from_observed_gaps(client):
    """Observed gaps after a tool call replace the prior in the expected gap."""
    for turn in range(7):
        client.post(CHAT, json=_chat(model="tool"), headers={"X-Tenure-Session": "learn"})
        record = _wait_state(client, "learn", "idle")
        if turn < 6:
            time.sleep(0.05)
    # Seven turns give six observed gaps of ~50 ms: the median replaces the 9 s tool prior.
    assert record["expected_gap_s"] < 2.0
    metrics = client.get("/metrics").text
    assert 'tenure_gap_observed_seconds_count{stop_class="tool"} 6.0' in metrics


@pytest.mark.parametrize(
    ("headers", "body_hints", "param"),
    [
        ({"X-Tenure-Session": "bad id!"}, None, "X-Tenure-Session"),
        (
            {"X-Tenure-Session": "s", "X-Tenure-Expected-Gap-Ms": "-5"},
            None,
            "X-Tenure-Expected-Gap-Ms",
        ),
        (
            {"X-Tenure-Session": "s", "X-Tenure-Expected-Gap-Ms": "1e15"},
            None,
            "X-Tenure-Expected-Gap-Ms",
        ),
        (
            {"X-Tenure-Session": "s", "X-Tenure-Expected-Gap-Ms": "soon"},
            None,
            "X-Tenure-Expected-Gap-Ms",
        ),
        ({"X-Tenure-Session": "s", "X-Tenure-Last-Turn": "maybe"}, None, "X-Tenure-Last-Turn"),
        ({}, {"session": 7}, "tenure.session"),
        ({}, {"session": "s", "last_turn": "yes"}, "tenure.last_turn"),
        ({}, {"session": "s", "expected_gap_ms": "NaN"}, "tenure.expected_gap_ms"),
        ({}, {"session": "s", "colour": "red"}, "tenure.colour"),
        ({}, "not-an-object", "tenure"),
        ({"X-Tenure-Session": "a"}, {"session": "b"}, "tenure.session"),
    ],
)
def test_malformed_hints_rejected_and_not_forwarded(upstream, client, headers, body_hints, param):
    fake, _ = upstream
    body = _chat()
    if body_hints is not None:
        body["tenure"] = body_hints
    before = len(fake.received)
    reply = client.post(CHAT, json=body, headers=headers)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["code"] == "invalid_tenure_hint"
    assert len(fake.received) == before


def test_oversized_body_rejected_and_not_forwarded(upstream, sidecar_factory):
    fake, _ = upstream
    server = sidecar_factory(max_body_bytes=4096)
    with httpx.Client(base_url=server.url) as http:
        reply = http.post(CHAT, json=_chat([{"role": "user", "content": "x" * 10_000}]))
    assert reply.status_code == 413
    assert reply.json()["error"]["param"] == "body"
    assert fake.received == []


def test_kv_transfer_params_must_be_an_object(upstream, client):
    fake, _ = upstream
    reply = client.post(CHAT, json=_chat(kv_transfer_params=[1]), headers={"X-Tenure-Session": "k"})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "kv_transfer_params"
    assert fake.received == []


def test_concurrent_updates_lose_nothing(client, sidecar):
    """Read-modify-write is atomic: 16 workers spawned at once all land in the parent's list."""
    from concurrent.futures import ThreadPoolExecutor

    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "hub"})

    def spawn(i: int) -> int:
        with httpx.Client(base_url=sidecar.url, timeout=10) as http:
            return http.post(
                "/v1/sessions/hub/workers", json={"worker_id": f"hub.w{i}"}
            ).status_code

    with ThreadPoolExecutor(max_workers=8) as pool:
        codes = list(pool.map(spawn, range(16)))
    assert codes == [201] * 16
    workers = client.get("/v1/sessions/hub").json()["workers"]
    assert sorted(workers) == sorted(f"hub.w{i}" for i in range(16))


def test_a_call_after_the_answer_sees_its_turn_recorded(sidecar_factory, monkeypatch):
    """The end-of-turn write runs after the answer has gone out; a lifecycle call that follows
    the answer waits for it (here the write is held back 0.3 s), so a harness reading its
    session after the last turn reads it finished."""
    import asyncio

    from tenure.service.api.turns.book import TurnBook

    original = TurnBook._record_turn_end

    async def late(self, turn, outcome):
        await asyncio.sleep(0.3)
        await original(self, turn, outcome)

    monkeypatch.setattr(TurnBook, "_record_turn_end", late)
    server = sidecar_factory()
    with httpx.Client(base_url=server.url, timeout=10) as http:
        headers = {"X-Tenure-Session": "late", "X-Tenure-Last-Turn": "true"}
        assert http.post(CHAT, json=_chat(), headers=headers).status_code == 200
        assert http.get("/v1/sessions/late").json()["state"] == "finished"
