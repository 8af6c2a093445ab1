"""``/v1/messages`` (Anthropic Messages) through the real sidecar, with the official clients.

The engine is the recording fake of ``fake_upstream`` (it answers in vLLM's Anthropic format,
whole and as its event stream); Redis is real. Each conversation must appear in
``GET /v1/sessions`` with its turn count, stop reason and predicted gap; bad input must be
refused in Anthropic's error shape with nothing forwarded and nothing stored.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

from tenure.service.api.shapes.messages import inspect, session_from_user_id
from tenure.service.policy.gap import DEFAULT_PRIOR_S

TOOL_GAP = DEFAULT_PRIOR_S["tool"]
HUMAN_GAP = DEFAULT_PRIOR_S["human"]
TOOLS = [{"name": "run_tests", "description": "run", "input_schema": {"type": "object"}}]


def _client(url: str) -> Any:
    # Any: the tests send shapes the client's TypedDicts do not spell (and bad ones on purpose).
    return anthropic.Anthropic(base_url=url, api_key="sk-any", max_retries=0)


def _session(http: httpx.Client, session: str) -> dict[str, Any]:
    response = http.get(f"/v1/sessions/{session}")
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


def _tenure(fake) -> list[dict[str, Any]]:
    return [
        r.body["kv_transfer_params"]["tenure"]
        for r in fake.received
        if r.path == "/v1/messages" and isinstance(r.body, dict)
    ]


def test_tool_loop_with_the_anthropic_client_whole_and_streamed(sidecar, client, upstream):
    fake, _ = upstream
    ai = _client(sidecar.url)
    history: list[dict[str, Any]] = [{"role": "user", "content": "fix the failing test"}]
    headers = {"X-Tenure-Session": "cc-1"}
    first = ai.messages.create(
        model="tool", max_tokens=16, messages=history, tools=TOOLS, extra_headers=headers
    )
    assert first.stop_reason == "tool_use"
    record = _session(client, "cc-1")
    assert record["turn"] == 1 and record["stop_reason"] == "tool_use"
    assert record["tool"] == "run_tests"
    assert record["expected_gap_s"] == pytest.approx(TOOL_GAP)

    history += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "1 passed"}]},
    ]  # fmt: skip
    with ai.messages.stream(
        model="echo", max_tokens=16, messages=history, extra_headers=headers
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "hi" and final.stop_reason == "end_turn"
    record = _session(client, "cc-1")
    assert record["turn"] == 2 and record["stop_reason"] == "end_turn"
    assert record["expected_gap_s"] == pytest.approx(HUMAN_GAP)
    tags = _tenure(fake)
    assert [t["session_id"] for t in tags] == ["default/cc-1", "default/cc-1"]
    assert [t["turn"] for t in tags] == [1, 2]


def test_stream_is_relayed_byte_for_byte(sidecar, upstream):
    _fake, up = upstream
    body = {"model": "tool", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    with httpx.Client(timeout=10) as http:
        direct = http.post(f"{up.url}/v1/messages", json=body).content
        proxied = http.post(
            f"{sidecar.url}/v1/messages", json=body, headers={"X-Tenure-Session": "bytes-1"}
        )
    assert proxied.headers["content-type"].startswith("text/event-stream")
    assert proxied.content == direct
    assert b"event: message_delta" in direct


@pytest.mark.parametrize(
    ("model", "stop", "gap"),
    [("pause", "pause_turn", TOOL_GAP), ("long", "max_tokens", HUMAN_GAP)],
)
def test_pause_turn_and_max_tokens_predict_their_gaps(sidecar, client, model, stop, gap):
    reply = _client(sidecar.url).messages.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": "x"}],
        extra_headers={"X-Tenure-Session": f"stop-{model}"},
    )  # fmt: skip
    assert reply.stop_reason == stop
    record = _session(client, f"stop-{model}")
    assert record["stop_reason"] == stop
    assert record["expected_gap_s"] == pytest.approx(gap)


def test_session_from_claude_code_metadata_user_id(sidecar, client):
    session = "5f8e2a9c-1b2c-4d5e-8f90-a1b2c3d4e5f6"
    user_id = "user_" + "ab" * 32 + "_account_1234abcd-0000_session_" + session
    ai = _client(sidecar.url)
    for _ in range(2):
        ai.messages.create(
            model="echo", max_tokens=8, messages=[{"role": "user", "content": "x"}],
            metadata={"user_id": user_id},
        )  # fmt: skip
    record = _session(client, "5f8e2a9c-1b2c-4d5e-8f90-a1b2c3d4e5f6")
    assert record["turn"] == 2 and not record["inferred"]
    # A plain user id names a user, not a session: it is not used (inferred instead).
    assert session_from_user_id("user-42") is None
    assert session_from_user_id('{"session_id": "s-9", "device_id": "d"}') == "s-9"


def test_inferred_session_survives_a_moving_cache_breakpoint(sidecar, client):
    """Claude Code moves its cache_control marker to the newest message every turn."""
    ai = _client(sidecar.url)
    mark = {"type": "ephemeral"}
    first = [{"role": "user", "content": [{"type": "text", "text": "task", "cache_control": mark}]}]
    system = [{"type": "text", "text": "you are a coder", "cache_control": mark}]
    ai.messages.create(model="tool", max_tokens=8, system=system, messages=first)
    second = [
        {"role": "user", "content": [{"type": "text", "text": "task"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": [{"type": "text", "text": "go on", "cache_control": mark}]},
    ]
    # The same model: the model seeds the prefix chain (another model shares no KV).
    ai.messages.create(model="tool", max_tokens=8, system=system, messages=second)
    sessions = client.get("/v1/sessions").json()["sessions"]
    assert len(sessions) == 1
    assert sessions[0]["turn"] == 2 and sessions[0]["inferred"]
    assert sessions[0]["stop_reason"] == "tool_use"


def test_cache_control_ttl_is_forwarded_as_retention(sidecar, upstream):
    fake, _ = upstream
    _client(sidecar.url).messages.create(
        model="echo", max_tokens=8,
        system=[{"type": "text", "text": "sys",
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": [
            {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "5m"}}]}],
        extra_headers={"X-Tenure-Session": "ttl-1"},
    )  # fmt: skip
    (tags,) = _tenure(fake)
    assert tags["retention_s"] == 3600.0
    # The breakpoints stay in the body: they are the engine's too.
    sent = fake.received[-1].body
    assert sent["system"][0]["cache_control"]["ttl"] == "1h"


def test_thinking_blocks_are_reasoning_segments() -> None:
    info = inspect(
        {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "let me think", "signature": "s"},
                    {"type": "redacted_thinking", "data": "xxxx"},
                    {"type": "text", "text": "answer"}]},
            ],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "tools": [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}],
        }
    )  # fmt: skip
    assert [(s.message_index, s.block_index, s.kind, s.chars) for s in info.reasoning] == [
        (1, 0, "thinking", 12),
        (1, 1, "redacted_thinking", 4),
    ]
    assert info.thinking_enabled
    assert [(b.where, b.index, b.ttl_s) for b in info.breakpoints] == [("tools", 0, 300.0)]


BAD_BODIES: list[tuple[str, Any, str]] = [
    ("not-json", b"{not json", "body"),
    ("not-object", b"[1, 2]", "body"),
    ("messages-not-list", {"model": "m", "max_tokens": 1, "messages": "hi"}, "messages"),
    ("metadata-string", {"model": "m", "max_tokens": 1, "messages": [], "metadata": "u"},
     "metadata"),
    ("user-id-number", {"model": "m", "max_tokens": 1, "messages": [],
                        "metadata": {"user_id": 42}}, "metadata.user_id"),
    ("cache-control-string", {"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": "5m"}]}]},
     "messages.0.content.0.cache_control"),
    ("cache-ttl-number", {"model": "m", "max_tokens": 1, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "x",
                                      "cache_control": {"type": "ephemeral", "ttl": 300}}]}]},
     "messages.0.content.0.cache_control.ttl"),
    ("cache-ttl-garbage", {"model": "m", "max_tokens": 1, "system": [
        {"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "forever"}}],
        "messages": []}, "system.0.cache_control.ttl"),
    ("bad-hint", {"model": "m", "max_tokens": 1, "messages": [], "tenure": {"session": "a b"}},
     "tenure.session"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "param"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_bad_input_is_refused_in_anthropic_shape(client, upstream, name, body, param):
    fake, _ = upstream
    if isinstance(body, bytes):
        response = client.post(
            "/v1/messages", content=body, headers={"content-type": "application/json"}
        )
    else:
        response = client.post("/v1/messages", json=body, headers={"X-Tenure-Session": "bad-1"})
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert param in error["error"]["message"]
    assert fake.received == []  # nothing forwarded
    assert client.get("/v1/sessions").json()["sessions"] == []  # nothing stored


def test_anthropic_client_raises_its_own_error_type(sidecar, upstream):
    with pytest.raises(anthropic.BadRequestError) as raised:
        _client(sidecar.url).messages.create(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}],
            metadata={"user_id": 7},
        )  # fmt: skip
    body: Any = raised.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert upstream[0].received == []


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic, on litellm's import
def test_litellm_anthropic_provider_through_the_sidecar(sidecar, client, monkeypatch):
    # The bundled model cost map: no fetch from the internet.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm = pytest.importorskip("litellm")
    for model in ("tool", "echo"):
        litellm.completion(
            model=f"anthropic/{model}",
            api_base=sidecar.url,
            api_key="sk-any",
            max_tokens=8,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Tenure-Session": "litellm-1"},
        )
    record = _session(client, "litellm-1")
    assert record["turn"] == 2 and record["stop_reason"] == "end_turn"


def test_a_cut_stream_ends_with_anthropic_error_event(sidecar, client):
    body = {"model": "die", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
    with httpx.Client(timeout=10) as http:
        reply = http.post(
            f"{sidecar.url}/v1/messages", json=body, headers={"X-Tenure-Session": "cut-1"}
        )
    assert reply.status_code == 200
    assert reply.content.endswith(b"\n\n") and b"event: error\ndata: " in reply.content
    assert b"[DONE]" not in reply.content  # not OpenAI's ending on Anthropic's route
    record = _session(client, "cut-1")
    # Taken back (issue 24): the harness's retry is the same turn.
    assert record["turn"] == 0 and record["state"] != "finished"
