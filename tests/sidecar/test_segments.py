"""Segment tracking through the proxy: the split of real proxied request pairs, roles and the
ranker at spawn, returns, bad input (4xx, nothing stored), no leaked state, tenant isolation.

The upstream is the fake vLLM (``tests/sidecar/fake_upstream.py``): its ``reasoning`` model
answers with ``message.reasoning`` and ``usage`` as vLLM with a reasoning parser does, and its
``/tokenize`` counts prompts as it counts ``usage.prompt_tokens``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from pydantic import SecretStr

from tenure.service.app import create_app
from tenure.service.settings import Settings, SettingsError, TenantSpec
from tests.conftest import wait_for
from tests.sidecar.fake_upstream import prompt_tokens, reasoning_answer

PREFIX = "tenure"


def user(n: int, words: int = 30) -> dict[str, str]:
    return {"role": "user", "content": " ".join(f"u{n}x{i}" for i in range(words))}


def forwarded(fake: Any, path: str = "/v1/chat/completions") -> list[dict[str, Any]]:
    return [r.body for r in fake.received if r.path == path]


def tenure_of(body: dict[str, Any]) -> dict[str, Any]:
    tags: dict[str, Any] = body["kv_transfer_params"]["tenure"]
    return tags


def segs(tags: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(s["id"], s["class"], s["start"]) for s in tags["segments"]]


def state_of(redis_url: str, tenant: str, session: str) -> dict[str, Any] | None:
    raw = redis.Redis.from_url(redis_url).get(f"{PREFIX}:seg:{tenant}:{session}")
    return None if raw is None else json.loads(raw)


def chat(
    http: httpx.Client, session: str, messages: list[Any], model: str = "reasoning", **headers: str
) -> httpx.Response:
    hdrs = {"X-Tenure-Session": session, **headers}
    return http.post(
        "/v1/chat/completions", json={"model": model, "messages": messages}, headers=hdrs
    )


def assistant(answer: dict[str, Any], keep_reasoning: bool) -> dict[str, Any]:
    message = dict(answer["choices"][0]["message"])
    if not keep_reasoning:
        message.pop("reasoning", None)
    return message


@pytest.fixture
def seg_client(sidecar_factory):
    server = sidecar_factory(segments=True, segment_tokenize=True)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        yield http


def test_reasoning_split_from_proxied_pairs_stripped_and_carried(upstream, seg_client, redis_url):
    fake, _ = upstream
    http = seg_client
    history: list[Any] = [user(1)]

    # Turn 1: a hint says the model reasons; the prompt is counted by /tokenize before forwarding.
    first = chat(http, "L", history, **{"X-Tenure-Reasoning": "true"})
    assert first.status_code == 200
    p1 = prompt_tokens(history)
    tags = tenure_of(forwarded(fake)[-1])
    assert tags["role"] == "lead" and tags["session_id"] == "default/L"
    assert segs(tags) == [("ctx", "lead", 0), ("t1.r", "reasoning", p1)]
    assert [r.path for r in fake.received].count("/tokenize") == 1
    wait_for(lambda: (state_of(redis_url, "default", "L") or {}).get("turn") == 1)

    # Turn 2: the harness stripped the reasoning: the response starts at p1 and is carried
    # output; t1.r is no longer declared (the engine closes it). The model reasons: expected.
    history += [assistant(first.json(), keep_reasoning=False), user(2)]
    second = chat(http, "L", history)
    p2 = prompt_tokens(history)
    tags = tenure_of(forwarded(fake)[-1])
    assert segs(tags) == [("ctx", "lead", 0), ("t1.out", "output", p1), ("t2.r", "reasoning", p2)]
    wait_for(lambda: (state_of(redis_url, "default", "L") or {}).get("turn") == 2)

    # Turn 3: a tool loop sends the reasoning back: t2.r stays open with its id, and the
    # output after it starts 40 reasoning tokens + 2 markers later.
    history += [assistant(second.json(), keep_reasoning=True), user(3, 5)]
    third = chat(http, "L", history)
    p3 = prompt_tokens(history)
    tags = tenure_of(forwarded(fake)[-1])
    assert segs(tags) == [
        ("ctx", "lead", 0),
        ("t1.out", "output", p1),
        ("t2.r", "reasoning", p2),
        ("t2.out", "output", p2 + 42),
        ("t3.r", "reasoning", p3),
    ]
    wait_for(lambda: (state_of(redis_url, "default", "L") or {}).get("turn") == 3)

    # Turn 4: the next user turn strips every reasoning: nothing of t2.r / t3.r is declared,
    # the carried outputs merge into one span.
    history[-2] = assistant(second.json(), keep_reasoning=False)
    history += [assistant(third.json(), keep_reasoning=False), user(4)]
    chat(http, "L", history, **{"X-Tenure-Last-Turn": "true"})
    p4 = prompt_tokens(history)
    tags = tenure_of(forwarded(fake)[-1])
    assert segs(tags) == [("ctx", "lead", 0), ("t1.out", "output", p1), ("t4.r", "reasoning", p4)]
    assert tags["last_turn"] is True
    # The session ended: its segment state is gone (nothing leaks in Redis).
    wait_for(lambda: state_of(redis_url, "default", "L") is None)


def test_without_tokenize_the_generation_is_not_declared(upstream, sidecar_factory, redis_url):
    """The default (vLLM offloads prompt blocks only): carried reasoning is still split."""
    fake, _ = upstream
    server = sidecar_factory(segments=True)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        history: list[Any] = [user(1)]
        first = chat(http, "D", history, **{"X-Tenure-Reasoning": "true"})
        assert segs(tenure_of(forwarded(fake)[-1])) == [("ctx", "lead", 0)]
        p1 = prompt_tokens(history)
        wait_for(lambda: (state_of(redis_url, "default", "D") or {}).get("turn") == 1)
        history += [assistant(first.json(), keep_reasoning=True), user(2)]
        chat(http, "D", history)
        assert segs(tenure_of(forwarded(fake)[-1])) == [
            ("ctx", "lead", 0),
            ("t1.r", "reasoning", p1),
            ("t1.out", "output", p1 + 42),
        ]
    assert "/tokenize" not in [r.path for r in fake.received]


def test_plain_model_splits_its_carried_output_and_never_tokenizes(upstream, seg_client, redis_url):
    fake, _ = upstream
    first = chat(seg_client, "P", [user(1)], model="echo")
    assert first.status_code == 200
    p1 = first.json()["usage"]["prompt_tokens"]
    wait_for(lambda: (state_of(redis_url, "default", "P") or {}).get("turn") == 1)
    second = [user(1), {"role": "assistant", "content": "hi"}, user(2)]
    assert chat(seg_client, "P", second, model="echo").status_code == 200
    bodies = forwarded(fake)
    assert segs(tenure_of(bodies[0])) == [("ctx", "lead", 0)]
    # No reasoning: the answer (and what follows it) is carried output from the prompt's end.
    assert segs(tenure_of(bodies[1])) == [("ctx", "lead", 0), ("t1.out", "output", p1)]
    assert "/tokenize" not in [r.path for r in fake.received]


def test_worker_spawn_ranker_return_and_bad_boundaries(upstream, seg_client, redis_url):
    fake, _ = upstream
    http = seg_client
    assert chat(http, "lead", [user(1)], model="echo").status_code == 200

    spawned = http.post(
        "/v1/sessions/lead/workers",
        json={"worker_id": "w1", "subagent_type": "Explore", "expected_tokens": 3000,
              "model": "echo"},
    )  # fmt: skip
    assert spawned.status_code == 201, spawned.text
    assert spawned.json()["predicted_lifetime_s"] == pytest.approx(115.5)  # the heuristic
    reviewer = http.post("/v1/sessions/lead/workers", json={"worker_id": "rv", "role": "reviewer"})
    assert reviewer.status_code == 201

    assert chat(http, "w1", [user(5)], model="echo").status_code == 200
    tags = tenure_of(forwarded(fake)[-1])
    assert tags["role"] == "worker" and tags["parent_session"] == "default/lead"
    assert tags["predicted_lifetime_s"] == pytest.approx(115.5)
    assert tags["expected_tokens"] == 3000
    assert segs(tags) == [("ctx", "worker", 0)]
    assert chat(http, "rv", [user(6)], model="echo").status_code == 200
    assert tenure_of(forwarded(fake)[-1])["role"] == "reviewer"

    # A worker spawned by hint on its first request: the parent must exist in this tenant.
    hinted = chat(http, "w2", [user(7)], model="echo", **{"X-Tenure-Parent": "lead"})
    assert hinted.status_code == 200
    assert tenure_of(forwarded(fake)[-1])["role"] == "worker"
    sent = len(fake.received)
    orphan = chat(http, "w3", [user(8)], model="echo", **{"X-Tenure-Parent": "nobody"})
    assert orphan.status_code == 404 and orphan.json()["error"]["code"] == "unknown_parent"
    assert len(fake.received) == sent  # not forwarded
    assert http.get("/v1/sessions/w3").status_code == 404  # nothing stored
    assert state_of(redis_url, "default", "w3") is None
    wrong = chat(http, "w1", [user(5)], model="echo", **{"X-Tenure-Parent": "w2"})
    assert wrong.status_code == 400 and wrong.json()["error"]["code"] == "parent_mismatch"

    # The lead cannot return; a worker returns once: the engine gets the closing notice.
    lead_return = http.post("/v1/sessions/lead/return")
    assert lead_return.status_code == 409 and lead_return.json()["error"]["code"] == "not_a_worker"
    done = http.post("/v1/sessions/w1/return")
    assert done.status_code == 200 and done.json()["state"] == "finished"
    notice = tenure_of(forwarded(fake, "/v1/completions")[-1])
    assert notice["session_id"] == "default/w1" and notice["last_turn"] is True
    assert notice["role"] == "worker" and notice["turn"] == 2
    assert notice["parent_session"] == "default/lead"
    again = http.post("/v1/sessions/w1/return")
    assert again.status_code == 409 and again.json()["error"]["code"] == "worker_returned"
    turn_before = http.get("/v1/sessions/w1").json()["turn"]
    late = chat(http, "w1", [user(5)], model="echo")
    assert late.status_code == 409 and late.json()["error"]["code"] == "worker_returned"
    assert http.get("/v1/sessions/w1").json()["turn"] == turn_before  # not counted

    # A worker whose own worker is live cannot return (a boundary out of order).
    assert http.post("/v1/sessions/w2/workers", json={"worker_id": "w2a"}).status_code == 201
    early = http.post("/v1/sessions/w2/return")
    assert early.status_code == 409 and early.json()["error"]["code"] == "boundary_order"
    assert http.post("/v1/sessions/w2a/return").status_code == 200
    assert http.post("/v1/sessions/w2/return").status_code == 200

    # A worker's request marked as its last turn is its return too.
    last = chat(http, "rv", [user(6)], model="echo", **{"X-Tenure-Last-Turn": "true"})
    assert last.status_code == 200
    wait_for(lambda: (state_of(redis_url, "default", "rv") or {}).get("returned") is True)
    assert http.post("/v1/sessions/rv/return").status_code == 409

    # Ending the lead leaves no live segment state: workers keep short-lived tombstones only,
    # a worker still live when its lead ends included.
    assert http.post("/v1/sessions/lead/workers", json={"worker_id": "w4"}).status_code == 201
    assert chat(http, "w4", [user(9)], model="echo").status_code == 200
    wait_for(lambda: (state_of(redis_url, "default", "w4") or {}).get("turn") == 1)
    assert http.post("/v1/sessions/lead/end").status_code == 200
    client = redis.Redis.from_url(redis_url)
    keys = [k.decode() for k in client.scan_iter(match=f"{PREFIX}:seg:default:*")]
    for key in keys:
        state = json.loads(client.get(key) or b"{}")
        assert state["returned"] is True, key
        assert 0 < client.ttl(key) <= 3600
    assert f"{PREFIX}:seg:default:lead" not in keys and f"{PREFIX}:seg:default:w4" in keys


def test_tenants_cannot_spawn_under_each_other(upstream, sidecar_factory):
    fake, _ = upstream
    server = sidecar_factory(
        segments=True,
        tenants={"key-a": TenantSpec(name="alpha"), "key-b": TenantSpec(name="beta")},
    )
    with httpx.Client(base_url=server.url, timeout=10) as http:
        a = {"Authorization": "Bearer key-a"}
        b = {"Authorization": "Bearer key-b"}
        body = {"model": "echo", "messages": [user(1)]}

        def ask(key: dict[str, str], **hints: str) -> int:
            response = http.post("/v1/chat/completions", json=body, headers={**key, **hints})
            return response.status_code

        def spawn(key: dict[str, str]) -> int:
            response = http.post("/v1/sessions/L/workers", json={"worker_id": "w"}, headers=key)
            return response.status_code

        assert ask(a, **{"X-Tenure-Session": "L"}) == 200
        assert ask(b, **{"X-Tenure-Session": "w", "X-Tenure-Parent": "L"}) == 404
        assert spawn(b) == 404
        assert spawn(a) == 201
        assert ask(a, **{"X-Tenure-Session": "w"}) == 200
        assert tenure_of(forwarded(fake)[-1])["parent_session"] == "alpha/L"
        # Beta's session of the same name is beta's own: a lead, no parent.
        assert ask(b, **{"X-Tenure-Session": "w"}) == 200
        tags = tenure_of(forwarded(fake)[-1])
        assert tags["session_id"] == "beta/w" and tags["role"] == "lead"
        assert http.post("/v1/sessions/w/return", headers=b).status_code == 409


def test_a_ranker_artefact_that_does_not_load_is_one_line(tmp_path: Path, redis_url: str):
    bad = tmp_path / "ranker.json"
    bad.write_text("{not json")

    def build(path: Path) -> None:
        create_app(
            Settings(
                redis_url=SecretStr(redis_url), segments=True, worker_ranker=str(path),
                dev_mode=True,
            )
        )  # fmt: skip

    with pytest.raises(SettingsError) as caught:
        build(bad)
    message = str(caught.value)
    assert str(bad) in message and "\n" not in message
    assert message.startswith("TENURE_WORKER_RANKER")
    with pytest.raises(SettingsError, match=r"absent\.json"):
        build(tmp_path / "absent.json")


def test_fake_reasoning_answer_counts_what_it_says() -> None:
    # The fixture's own arithmetic, so the split test's expectations rest on something checked.
    answer = reasoning_answer([user(1)])
    usage = answer["usage"]
    message = answer["choices"][0]["message"]
    assert (
        usage["completion_tokens"]
        == len(message["reasoning"].split()) + len(message["content"].split()) + 2
    )
    assert usage["prompt_tokens"] == 1 + 3 + 30 + 2


def test_a_trained_ranker_from_the_setting_predicts_at_spawn(sidecar_factory, tmp_path: Path):
    from tenure.service.policy.ranker import RidgeRanker, SpawnRecord
    from tenure.service.policy.ranker_fit import fit_ridge
    from tests.policy.test_ranker import synthetic

    path = tmp_path / "ranker.json"
    fit_ridge(synthetic(), 1.0).save(path)
    ranker = RidgeRanker.load(path)
    server = sidecar_factory(segments=True, worker_ranker=str(path))
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert chat(http, "R", [user(1)], model="echo").status_code == 200
        got = []
        for kind in ("Explore", "Plan"):
            spawn = {"worker_id": f"R-{kind}", "subagent_type": kind, "expected_tokens": 10000,
                     "model": "claude-haiku-4-5"}  # fmt: skip
            answer = http.post("/v1/sessions/R/workers", json=spawn)
            assert answer.status_code == 201
            got.append(answer.json()["predicted_lifetime_s"])
    # As the replay derives them: the parent's call index 0, its context after the call (30
    # prompt words + the echo's 3 answer tokens), the second spawn second in its fan-out.
    want = [
        ranker.predict_lifetime_s(
            SpawnRecord(
                kind,
                "claude-haiku-4-5",
                10000,
                parent_turn=0,
                parent_context_tokens=33,
                fanout=k + 1,
                sibling_index=k,
                session_elapsed_s=0.0,
                workers_before=k,
            )
        )
        for k, kind in enumerate(("Explore", "Plan"))
    ]
    # The artefact's own predictions (session_elapsed_s is the only clock-dependent input:
    # within a test it is well under a second, a tiny feature change after log1p).
    assert got == pytest.approx(want, rel=0.05)
    assert got[1] > got[0]  # the trained order: Plan outlives Explore


def test_redis_down_forwards_without_segments_and_recovers(
    upstream, sidecar_factory, redis_process_factory
):
    fake, _ = upstream
    server_redis = redis_process_factory()
    server = sidecar_factory(
        redis_url=server_redis.url, segments=True, redis_retry_after_s=0.2, early_forward=False
    )
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert chat(http, "F", [user(1)], model="echo").status_code == 200
        assert segs(tenure_of(forwarded(fake)[-1])) == [("ctx", "lead", 0)]
        server_redis.stop()
        down = chat(http, "F", [user(1)], model="echo")
        assert down.status_code == 200  # fail open: forwarded, no segments
        assert "segments" not in forwarded(fake)[-1].get("kv_transfer_params", {}).get("tenure", {})
        server_redis.start()

        def healthy() -> bool:
            chat(http, "F", [user(1)], model="echo")
            return "segments" in tenure_of(forwarded(fake)[-1])

        wait_for(healthy, timeout_s=10.0, interval_s=0.3)
