"""Hint dialects (Dynamo, vLLM's agent-hint RFC, OpenAI ``prompt_cache_key``, llm-d): the
same logical session in each dialect reaches the engine with the same Tenure hints; conflicts
resolve by the documented precedence; malformed or unknown fields are ignored and counted.

Through the real sidecar on a real Redis; the engine is the recording fake, and what it
received is read back with the adapter's own parser (``tenure.engine_adapter.tags.parse_tags``).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tenure.engine_adapter.tags import parse_tags
from tenure.service.api.hints import dialects
from tenure.service.api.hints.tenure import Hints

MESSAGES = [{"role": "user", "content": "plan the refactor"}]

#: One logical session: "task-42", child of "lead-1", last turn, kept five minutes.
DIALECTS: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "tenure": (
        {"X-Tenure-Session": "task-42", "X-Tenure-Parent": "lead-1", "X-Tenure-Last-Turn": "true"},
        {"nvext": {"cache_control": {"type": "ephemeral", "ttl": "5m"}}},
    ),
    "dynamo": (
        {"X-Dynamo-Session-ID": "task-42", "X-Dynamo-Parent-Session-ID": "lead-1",
         "X-Dynamo-Session-Final": "true"},
        {"nvext": {"cache_control": {"type": "ephemeral", "ttl": "5m"},
                   "agent_hints": {"priority": 5, "osl": 64}}},
    ),
    "vllm": (
        {"X-Tenure-Last-Turn": "true"},
        {"agent_hint": {"session_id": "task-42", "parent_session_id": "lead-1",
                        "cache_control": {"type": "ephemeral", "ttl": 300}}},
    ),
}  # fmt: skip
#: Dialects that carry a session only.
SESSION_ONLY: dict[str, tuple[dict[str, str], dict[str, Any]]] = {
    "tenure": ({"X-Tenure-Session": "task-42"}, {}),
    "openai": ({}, {"prompt_cache_key": "task-42"}),
    "llm-d": ({"X-Session-Token": "task-42"}, {}),
    "dynamo": ({"X-Dynamo-Session-ID": "task-42"}, {}),
    "vllm": ({}, {"agent_hint": {"session_id": "task-42"}}),
}


def _send(url: str, headers: dict[str, str], extra: dict[str, Any], path: str) -> None:
    if path == "/v1/messages":
        body: dict[str, Any] = {"model": "echo", "max_tokens": 8, "messages": MESSAGES, **extra}
    else:
        body = {"model": "echo", "messages": MESSAGES, **extra}
    response = httpx.post(f"{url}{path}", json=body, headers=headers, timeout=10)
    assert response.status_code == 200, response.text


def _tenure(fake) -> dict[str, Any]:
    tags: dict[str, Any] = fake.received[-1].body["kv_transfer_params"]["tenure"]
    return tags


def _metric(url: str, dialect: str, field: str, outcome: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    want = f'tenure_dialect_fields_total{{dialect="{dialect}",field="{field}",outcome="{outcome}"}}'
    for line in text.splitlines():
        if line.startswith(want):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
@pytest.mark.parametrize("dialect", sorted(DIALECTS))
def test_each_dialect_gives_the_same_hints_at_the_adapter(sidecar, upstream, dialect, path):
    fake, _ = upstream
    headers, extra = DIALECTS[dialect]
    _send(sidecar.url, headers, extra, path)
    tags = _tenure(fake)
    assert tags == {
        "session_id": "default/task-42",
        "turn": 1,
        "last_turn": True,
        "parent": "default/lead-1",
        "retention_s": 300.0,
    }
    parsed = parse_tags({"tenure": tags})
    assert (parsed.session_id, parsed.turn, parsed.last_turn, parsed.invalid) == (
        "default/task-42", 1, True, 0,
    )  # fmt: skip


@pytest.mark.parametrize("dialect", sorted(SESSION_ONLY))
def test_each_session_key_names_the_same_session(sidecar, upstream, client, dialect):
    fake, _ = upstream
    headers, extra = SESSION_ONLY[dialect]
    for _ in range(2):
        _send(sidecar.url, headers, extra, "/v1/chat/completions")
    assert _tenure(fake)["session_id"] == "default/task-42"
    record = client.get("/v1/sessions/task-42").json()
    assert record["turn"] == 2 and not record["inferred"]


def test_conflicts_resolve_by_precedence(sidecar, upstream):
    fake, _ = upstream
    ladder: list[tuple[str, dict[str, str], dict[str, Any]]] = [
        ("tenure", {"X-Tenure-Session": "s-tenure"}, {}),
        ("dynamo", {"X-Dynamo-Session-ID": "s-dynamo"}, {}),
        ("vllm", {}, {"agent_hint": {"session_id": "s-vllm"}}),
        ("openai", {}, {"prompt_cache_key": "s-openai"}),
        ("llm-d", {"X-Session-Token": "s-llmd"}, {}),
    ]
    for top in range(len(ladder)):
        headers: dict[str, str] = {}
        extra: dict[str, Any] = {}
        for _name, h, e in ladder[top:]:
            headers.update(h)
            extra.update(e)
        _send(sidecar.url, headers, extra, "/v1/chat/completions")
        winner = (
            ladder[top][1].get("X-Tenure-Session")
            or ladder[top][1].get("X-Dynamo-Session-ID")
            or ladder[top][1].get("X-Session-Token")
        )
        if winner is None:
            e = ladder[top][2]
            winner = e["agent_hint"]["session_id"] if "agent_hint" in e else e["prompt_cache_key"]
        assert _tenure(fake)["session_id"] == f"default/{winner}", ladder[top][0]
    # Every source below the winner was counted as overridden, never as an error.
    assert _metric(sidecar.url, "llm-d", "x-session-token", "overridden") == 4
    assert _metric(sidecar.url, "dynamo", "x-dynamo-session-id", "overridden") == 1
    assert _metric(sidecar.url, "dynamo", "x-dynamo-session-id", "used") == 1


def test_route_keys_rank_below_dialects(sidecar, upstream):
    fake, _ = upstream
    user_id = "user_x_account_y_session_0000aaaa-1111-2222-3333-444455556666"
    body = {"model": "echo", "max_tokens": 8, "messages": MESSAGES,
            "metadata": {"user_id": user_id}, "agent_hint": {"session_id": "s-vllm"}}  # fmt: skip
    assert httpx.post(f"{sidecar.url}/v1/messages", json=body, timeout=10).status_code == 200
    assert _tenure(fake)["session_id"] == "default/s-vllm"
    del body["agent_hint"]
    assert httpx.post(f"{sidecar.url}/v1/messages", json=body, timeout=10).status_code == 200
    assert _tenure(fake)["session_id"] == "default/0000aaaa-1111-2222-3333-444455556666"


def test_malformed_and_unknown_fields_are_ignored_and_counted(sidecar, upstream, client):
    fake, _ = upstream
    headers = {"X-Dynamo-Session-Final": "maybe", "X-Dynamo-Session-ID": "d-1"}
    extra = {
        "agent_hint": {"session_id": 42, "cache_control": {"ttl": 99999}, "shiny": 1},
        "nvext": {"cache_control": {"type": "ephemeral", "ttl": "forever"}, "weird": True},
        "prompt_cache_key": ["not", "a", "string"],
    }
    _send(sidecar.url, headers, extra, "/v1/chat/completions")
    tags = _tenure(fake)
    # Only the well-formed field became a hint; the rest were not forwarded as Tenure hints.
    assert tags == {"session_id": "default/d-1", "turn": 1, "last_turn": False}
    # The dialect fields themselves are the engine's to read: they stay in the body.
    assert fake.received[-1].body["agent_hint"]["shiny"] == 1
    for dialect, field, outcome in [
        ("dynamo", "x-dynamo-session-final", "ignored"),
        ("dynamo", "nvext.cache_control", "ignored"),
        ("dynamo", "unknown", "unknown"),
        ("vllm", "agent_hint.session_id", "ignored"),
        ("vllm", "agent_hint.cache_control", "ignored"),
        ("vllm", "unknown", "unknown"),
        ("openai", "prompt_cache_key", "ignored"),
    ]:
        assert _metric(sidecar.url, dialect, field, outcome) == 1, (dialect, field, outcome)
    # No label carries client text.
    text = client.get("/metrics").text
    assert "shiny" not in text and "weird" not in text


def test_keys_that_are_not_ids_map_to_stable_ids() -> None:
    token = "ZGVmYXVsdC9wb2QtYQ=="  # llm-d's token: base64 of a pod name
    assert dialects.session_key(token) == dialects.session_key(token)
    assert (dialects.session_key(token) or "").startswith("k-")
    assert dialects.session_key("task-42") == "task-42"
    assert dialects.session_key("x" * 2000) is None
    assert dialects.retention_seconds("1h") == 3600 and dialects.retention_seconds("30m") == 1800
    assert dialects.retention_seconds("-5m") is None and dialects.retention_seconds(True) is None


def test_tenure_hints_win_over_every_dialect_field() -> None:
    reading = dialects.read(
        {"x-dynamo-session-id": "b", "x-dynamo-parent-session-id": "p2"},
        {"agent_hint": {"session_id": "c", "cache_control": {"ttl": 60}}},
    )
    merged, events = dialects.apply(Hints(session="a", parent="p1"), reading)
    assert (merged.session, merged.parent, merged.retention_s) == ("a", "p1", 60.0)
    assert ("dynamo", "x-dynamo-session-id", "overridden") in events
    assert ("vllm", "agent_hint.cache_control", "used") in events
