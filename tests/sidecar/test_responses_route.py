"""``/v1/responses`` (OpenAI Responses) through the real sidecar, with the official clients.

Sessions chain exactly by ``previous_response_id``, never across tenants; the gap comes from
the answer's output items. The engine is the recording fake of ``fake_upstream``.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tenure.service.policy.gap import DEFAULT_PRIOR_S

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
TENANTS = {KEY_A: {"name": "a"}, KEY_B: {"name": "b"}}


def _client(url: str, key: str = "sk-any") -> Any:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def _sessions(url: str, key: str = "sk-any") -> list[dict[str, Any]]:
    response = httpx.get(
        f"{url}/v1/sessions", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    response.raise_for_status()
    sessions: list[dict[str, Any]] = response.json()["sessions"]
    return sessions


def _forwarded(fake) -> list[dict[str, Any]]:
    return [r.body for r in fake.received if r.path == "/v1/responses"]


def test_a_chain_is_one_session_whole_and_streamed(sidecar, upstream):
    fake, _ = upstream
    oa = _client(sidecar.url)
    first = oa.responses.create(model="tool", input="fix the failing test")
    assert first.output[0].type == "function_call"
    (record,) = _sessions(sidecar.url)
    assert record["turn"] == 1 and record["stop_reason"] == "function_call"
    assert record["tool"] == "run_tests"
    assert record["expected_gap_s"] == pytest.approx(DEFAULT_PRIOR_S["tool"])
    assert not record["inferred"]

    result = [{"type": "function_call_output", "call_id": "call_1", "output": "1 passed"}]
    stream = oa.responses.create(
        model="echo", input=result, previous_response_id=first.id, stream=True
    )
    events = [event.type for event in stream]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    (record,) = _sessions(sidecar.url)
    assert record["turn"] == 2 and record["stop_reason"] == "stop"
    assert record["expected_gap_s"] == pytest.approx(DEFAULT_PRIOR_S["human"])

    # The streamed answer's id chains too.
    third = oa.responses.create(model="long", input="more", previous_response_id="resp_000002")
    assert third.status == "incomplete"
    (record,) = _sessions(sidecar.url)
    assert record["turn"] == 3 and record["stop_reason"] == "max_tokens"
    sids = {body["kv_transfer_params"]["tenure"]["session_id"] for body in _forwarded(fake)}
    assert sids == {f"default/{record['session_id']}"}


def test_prompt_cache_key_and_conversation_are_session_keys(sidecar):
    oa = _client(sidecar.url)
    for _ in range(2):
        oa.responses.create(model="echo", input="x", prompt_cache_key="codex-7")
    oa.responses.create(model="echo", input="x", extra_body={"conversation": "conv-1"})
    records = {r["session_id"]: r for r in _sessions(sidecar.url)}
    assert records["codex-7"]["turn"] == 2
    assert records["conv-1"]["turn"] == 1


def test_previous_response_of_another_tenant_is_refused(sidecar_factory, upstream):
    fake, _ = upstream
    sidecar = sidecar_factory(tenants=TENANTS)
    mine = _client(sidecar.url, KEY_A).responses.create(model="echo", input="secret plan")
    before = len(fake.received)
    with pytest.raises(openai.BadRequestError) as raised:
        _client(sidecar.url, KEY_B).responses.create(
            model="echo", input="continue", previous_response_id=mine.id
        )
    error = raised.value.body
    assert isinstance(error, dict) and error["param"] == "previous_response_id"
    assert error["code"] == "previous_response_not_found"
    assert len(fake.received) == before  # nothing forwarded
    assert _sessions(sidecar.url, KEY_B) == []  # nothing stored
    # The owner chains as usual.
    _client(sidecar.url, KEY_A).responses.create(
        model="echo", input="go", previous_response_id=mine.id
    )
    (record,) = _sessions(sidecar.url, KEY_A)
    assert record["turn"] == 2


BAD: list[tuple[str, dict[str, Any], str]] = [
    ("unknown-previous", {"model": "m", "input": "x", "previous_response_id": "resp_nope"},
     "previous_response_id"),
    ("previous-number", {"model": "m", "input": "x", "previous_response_id": 7},
     "previous_response_id"),
    ("conversation-object", {"model": "m", "input": "x", "conversation": {"name": "c"}},
     "conversation.id"),
    ("both", {"model": "m", "input": "x", "conversation": "c", "previous_response_id": "r"},
     "conversation"),
    ("cache-key-number", {"model": "m", "input": "x", "prompt_cache_key": 5},
     "prompt_cache_key"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_refused_in_openai_shape(client, upstream, name, body, param):
    fake, _ = upstream
    response = client.post("/v1/responses", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert fake.received == []
    assert client.get("/v1/sessions").json()["sessions"] == []


def test_langchain_openai_on_the_responses_api(sidecar):
    langchain_openai = pytest.importorskip("langchain_openai")
    chat = langchain_openai.ChatOpenAI(
        base_url=f"{sidecar.url}/v1",
        api_key="sk-any",
        model="echo",
        use_responses_api=True,
        max_retries=0,
        default_headers={"X-Tenure-Session": "lc-1"},
    )
    chat.invoke("hello")
    for _chunk in chat.stream("again"):
        pass
    records = {r["session_id"]: r for r in _sessions(sidecar.url)}
    assert records["lc-1"]["turn"] == 2 and records["lc-1"]["stop_reason"] == "stop"


def test_stored_responses_are_read_only_by_their_tenant(sidecar_factory, upstream):
    fake, _ = upstream
    sidecar = sidecar_factory(tenants=TENANTS)
    mine = _client(sidecar.url, KEY_A).responses.create(model="echo", input="secret plan")
    before = len(fake.received)
    for path in (f"/v1/responses/{mine.id}", f"/v1/responses/{mine.id}/input_items"):
        other = httpx.get(
            f"{sidecar.url}{path}", headers={"Authorization": f"Bearer {KEY_B}"}, timeout=10
        )
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    cancel = httpx.post(
        f"{sidecar.url}/v1/responses/{mine.id}/cancel",
        headers={"Authorization": f"Bearer {KEY_B}"}, timeout=10,
    )  # fmt: skip
    assert cancel.status_code == 404
    assert len(fake.received) == before  # never forwarded
    owner = httpx.get(
        f"{sidecar.url}/v1/responses/{mine.id}",
        headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10,
    )  # fmt: skip
    assert owner.status_code == 200  # forwarded to the engine for its owner
    assert fake.received[-1].path == f"/v1/responses/{mine.id}"


def test_a_forged_tenure_is_replaced_by_the_sidecars(sidecar_factory, upstream):
    fake, _ = upstream
    sidecar = sidecar_factory(tenants=TENANTS)
    forged = {"session_id": "b/victim", "turn": 9, "last_turn": True}
    body = {"model": "echo", "input": "x",
            "kv_transfer_params": {"tenure": forged, "do_remote_prefill": False}}  # fmt: skip
    reply = httpx.post(
        f"{sidecar.url}/v1/responses", json=body,
        headers={"Authorization": f"Bearer {KEY_A}"}, timeout=10,
    )  # fmt: skip
    assert reply.status_code == 200
    sent = fake.received[-1].body["kv_transfer_params"]
    assert sent["do_remote_prefill"] is False
    assert sent["tenure"]["session_id"].startswith("a/r-")
    assert sent["tenure"]["last_turn"] is False
