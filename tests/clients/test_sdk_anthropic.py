"""The session object on the official ``anthropic`` client, against the real sidecar.

Hints, last turn, suspend/resume and workers work as they do on ``openai``; the Anthropic
client's ``x-api-key`` selects the tenant. The engine is the recording fake of
``tests/sidecar/fake_upstream`` (vLLM's Anthropic answers); Redis is real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tenure.clients import AsyncTenureSession, TenureSession, TenureUsageError
from tenure.service.app import create_app
from tenure.service.settings import load_settings
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
MESSAGES = [{"role": "user", "content": "fix the failing test"}]


@pytest.fixture
def stack(redis_url: str) -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    engine = ServerThread(fake).start()
    settings = load_settings(
        redis_url=redis_url, upstream_url=engine.url, admin_token="admin-token-for-tests",
        push_addr="", tenants={KEY_A: {"name": "a"}, KEY_B: {"name": "b"}},
    )  # fmt: skip
    sidecar = ServerThread(create_app(settings)).start()
    try:
        yield fake, sidecar
    finally:
        sidecar.stop()
        engine.stop()


def _record(url: str, session: str, key: str = KEY_A) -> dict[str, Any]:
    response = httpx.get(
        f"{url}/v1/sessions/{session}", headers={"Authorization": f"Bearer {key}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


def _tenure(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r.body["kv_transfer_params"]["tenure"] for r in fake.received]


def test_session_on_the_anthropic_client(stack) -> None:
    fake, sidecar = stack
    client = anthropic.Anthropic(base_url=sidecar.url, api_key=KEY_A, max_retries=0)
    with TenureSession(client, session_id="cc-sdk", segment="lead") as s:
        reply = s.messages(model="tool", max_tokens=8, messages=MESSAGES, expected_gap_s=4)
        assert reply.stop_reason == "tool_use"
        stream = s.messages(model="echo", max_tokens=8, messages=MESSAGES, stream=True)
        assert [e.type for e in stream][-1] == "message_stop"
        s.suspend(reason="approval", expected_wait_s=600)
        assert _record(sidecar.url, "cc-sdk")["state"] == "suspended"
        s.resume()
        with s.spawn("cc-sdk.review", role="reviewer") as reviewer:
            reviewer.messages(model="echo", max_tokens=8, messages=MESSAGES, last_turn=True)
        s.messages(model="echo", max_tokens=8, messages=MESSAGES, last_turn=True)
    record = _record(sidecar.url, "cc-sdk")
    assert record["turn"] == 3 and record["state"] == "finished"
    assert record["workers"] == ["cc-sdk.review"]
    tags = _tenure(fake)
    assert tags[0]["session_id"] == "a/cc-sdk" and tags[0]["expected_gap_s"] == 4
    assert tags[0]["segment"] == "lead"
    assert tags[2] == {"session_id": "a/cc-sdk.review", "turn": 1, "last_turn": True,
                       "parent": "a/cc-sdk", "segment": "lead"}  # fmt: skip
    assert tags[-1]["last_turn"] is True
    # The tenant's key never reaches the engine, in either spelling.
    for seen in fake.received:
        assert "x-api-key" not in seen.headers and "authorization" not in seen.headers
    # Another tenant's key cannot see the session.
    missing = httpx.get(
        f"{sidecar.url}/v1/sessions/cc-sdk", headers={"Authorization": f"Bearer {KEY_B}"}
    )
    assert missing.status_code == 404


async def test_async_session_on_the_anthropic_client(stack) -> None:
    _fake, sidecar = stack
    client = anthropic.AsyncAnthropic(base_url=sidecar.url, api_key=KEY_A, max_retries=0)
    async with AsyncTenureSession(client, session_id="cc-async") as s:
        reply = await s.messages(model="tool", max_tokens=8, messages=MESSAGES)
        assert reply.stop_reason == "tool_use"
        stream = await s.messages(model="echo", max_tokens=8, messages=MESSAGES, stream=True)
        assert [e.type async for e in stream][-1] == "message_stop"
        assert (await s.info())["turn"] == 2
    assert _record(sidecar.url, "cc-async")["state"] == "finished"


def test_unknown_key_on_messages_is_refused_in_anthropic_shape(stack) -> None:
    fake, sidecar = stack
    client = anthropic.Anthropic(base_url=sidecar.url, api_key="sk-nobody", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        client.messages.create(model="echo", max_tokens=8, messages=MESSAGES)  # type: ignore[arg-type]
    assert fake.received == []


def test_wrong_call_for_the_client_is_a_usage_error(stack) -> None:
    _fake, sidecar = stack
    client = anthropic.Anthropic(base_url=sidecar.url, api_key=KEY_A, max_retries=0)
    with (
        TenureSession(client, session_id="cc-wrong", end_on_exit=False) as s,
        pytest.raises(TenureUsageError),
    ):
        s.chat(model="m", messages=MESSAGES)
