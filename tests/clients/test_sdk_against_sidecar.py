"""The SDK against the real sidecar (``tenure.service.app.create_app``) served by uvicorn, on a real
Redis.

Only the engine is faked, at the network boundary: the sidecar's upstream transport records what
the proxy forwards (as vLLM would receive it) and answers like an OpenAI server.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
import uvicorn

from tenure.clients import AsyncTenureSession, TenureLifecycleError, TenureSession
from tenure.service.processes import free_port

KEY_A = "sk-tenant-a-0123456789"
KEY_B = "sk-tenant-b-0123456789"
MESSAGES = [{"role": "user", "content": "fix the failing test"}]


class _Stream(httpx.AsyncByteStream):
    """A not-yet-read body: the proxy relays upstream bytes as a stream, as from a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


def _reply(content_type: str, data: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": content_type}, stream=_Stream(data))


@dataclass
class Upstream:
    """What the engine received; answers chat, completions and streams."""

    bodies: list[dict[str, Any]] = field(default_factory=list)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if body.get("stream"):
            chunk = {
                "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
            }  # fmt: skip
            sse = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
            return _reply("text/event-stream", sse.encode())
        if request.url.path.endswith("/chat/completions"):
            answer: dict[str, Any] = {
                "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "done"}}],
            }  # fmt: skip
        else:
            answer = {
                "id": "t1", "object": "text_completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "text": "x", "finish_reason": "stop", "logprobs": None}],
            }  # fmt: skip
        return _reply("application/json", json.dumps(answer).encode())

    def tenure(self) -> list[dict[str, Any]]:
        return [b["kv_transfer_params"]["tenure"] for b in self.bodies]


@dataclass
class Sidecar:
    base_url: str
    upstream: Upstream

    def session(self, session_id: str, api_key: str = KEY_A) -> dict[str, Any]:
        """The sidecar's record, read independently of the SDK under test."""
        response = httpx.get(
            f"{self.base_url}/sessions/{session_id}",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=10,
        )
        response.raise_for_status()
        record: dict[str, Any] = response.json()
        return record


@pytest.fixture
def sidecar(redis_url: str) -> Iterator[Sidecar]:
    from tenure.service.app import create_app
    from tenure.service.settings import load_settings

    upstream = Upstream()
    settings = load_settings(
        redis_url=redis_url,
        upstream_url="http://engine.test",
        admin_token="admin-token-for-tests",
        push_addr="",
        tenants={KEY_A: {"name": "a"}, KEY_B: {"name": "b"}},
    )
    app = create_app(settings, upstream_transport=httpx.MockTransport(upstream.handle))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="sidecar", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("sidecar did not start")
        time.sleep(0.02)
    try:
        yield Sidecar(f"http://127.0.0.1:{port}/v1", upstream)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def _client(sidecar: Sidecar, api_key: str = KEY_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=sidecar.base_url, api_key=api_key, max_retries=0)


def _async_client(sidecar: Sidecar, api_key: str = KEY_A) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=sidecar.base_url, api_key=api_key, max_retries=0)


def test_turns_carry_hints_to_the_engine(sidecar: Sidecar) -> None:
    """Session id, turn, gap and segment reach the engine as kv_transfer_params.tenure."""
    with TenureSession(_client(sidecar), session_id="agent-1", segment="lead") as s:
        assert s.chat(model="m", messages=MESSAGES, expected_gap_s=7.5).choices[0].message.content
        s.complete(model="m", prompt="def f(", expected_gap_s=2)
        record = sidecar.session("agent-1")
        assert record["turn"] == 2 and record["state"] in {"active", "idle"}
        assert record["expected_gap_s"] == pytest.approx(2.0)
    first, second = sidecar.upstream.tenure()
    assert first["session_id"] == "a/agent-1" and first["segment"] == "lead"
    assert first["expected_gap_s"] == pytest.approx(7.5) and first["last_turn"] is False
    assert second["turn"] == first["turn"] + 1
    assert all("tenure" not in body for body in sidecar.upstream.bodies)
    assert sidecar.session("agent-1")["state"] == "finished"  # ended on context exit


def test_streaming_through_the_sidecar(sidecar: Sidecar) -> None:
    with TenureSession(_client(sidecar), session_id="agent-2") as s:
        chunks = list(s.chat(model="m", messages=MESSAGES, stream=True))
        assert [c.choices[0].delta.content for c in chunks] == ["ok"]
    [body] = sidecar.upstream.bodies
    assert (
        body["stream"] is True and body["kv_transfer_params"]["tenure"]["session_id"] == "a/agent-2"
    )


def test_last_turn_finishes_without_an_extra_end(sidecar: Sidecar) -> None:
    with TenureSession(_client(sidecar), session_id="agent-3") as s:
        s.chat(model="m", messages=MESSAGES)
        s.chat(model="m", messages=MESSAGES, last_turn=True)
        assert s.state == "finished"
    assert sidecar.upstream.tenure()[-1]["last_turn"] is True
    record = sidecar.session("agent-3")
    assert record["state"] == "finished" and record["last_turn"] is True


def test_suspend_and_resume(sidecar: Sidecar) -> None:
    with TenureSession(_client(sidecar), session_id="agent-4") as s:
        s.chat(model="m", messages=MESSAGES)
        view = s.suspend(reason="approval", expected_wait_s=900)
        assert view["state"] == "suspended"
        record = sidecar.session("agent-4")
        assert record["state"] == "suspended" and record["suspend_reason"] == "approval"
        assert record["expected_wait_s"] == pytest.approx(900)
        s.resume()
        assert sidecar.session("agent-4")["state"] != "suspended"
        assert s.info()["turn"] == 1


def test_spawned_worker_names_its_parent(sidecar: Sidecar) -> None:
    with TenureSession(_client(sidecar), session_id="lead-5") as lead:
        lead.chat(model="m", messages=MESSAGES)
        with lead.spawn("lead-5.w1", role="reviewer", metadata={"files": 3}) as worker:
            worker.chat(model="m", messages=MESSAGES, last_turn=True)
        record = sidecar.session("lead-5.w1")
        assert record["parent"] == "lead-5" and record["role"] == "reviewer"
        assert record["metadata"] == {"files": 3} and record["state"] == "finished"
        assert "lead-5.w1" in sidecar.session("lead-5")["workers"]
    assert sidecar.upstream.tenure()[-1]["parent"] == "a/lead-5"


def test_context_exit_ends_the_session_on_an_exception(sidecar: Sidecar) -> None:
    with (
        pytest.raises(RuntimeError, match="tool failed"),
        TenureSession(_client(sidecar), session_id="agent-6") as s,
    ):
        s.chat(model="m", messages=MESSAGES)
        raise RuntimeError("tool failed")
    assert sidecar.session("agent-6")["state"] == "finished"


def test_other_tenants_cannot_touch_the_session(sidecar: Sidecar) -> None:
    """The SDK authenticates lifecycle calls with the client's key, so tenant scoping holds."""
    with TenureSession(_client(sidecar), session_id="agent-7") as s:
        s.chat(model="m", messages=MESSAGES)
        intruder = TenureSession(_client(sidecar, KEY_B), session_id="agent-7", end_on_exit=False)
        with pytest.raises(TenureLifecycleError) as err:
            intruder.end()
        assert err.value.status == 404
        intruder.close()
        assert sidecar.session("agent-7")["state"] != "finished"


async def test_async_session_lifecycle(sidecar: Sidecar) -> None:
    async with AsyncTenureSession(_async_client(sidecar), session_id="agent-8") as s:
        await s.chat(model="m", messages=MESSAGES, expected_gap_s=1.5)
        async with await s.spawn("agent-8.w1") as worker:
            stream = await worker.chat(model="m", messages=MESSAGES, stream=True)
            assert [c.choices[0].delta.content async for c in stream] == ["ok"]
        await s.suspend(reason="review")
        assert (await s.info())["state"] == "suspended"
    assert sidecar.session("agent-8")["state"] == "finished"
    assert sidecar.session("agent-8.w1")["state"] == "finished"
    assert [t["session_id"] for t in sidecar.upstream.tenure()] == ["a/agent-8", "a/agent-8.w1"]


def test_example_agent_loop_runs(
    sidecar: Sidecar, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's example, end to end through the sidecar."""
    from tenure.clients.examples.agent_loop import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY_A)
    code = main(
        ["--base-url", sidecar.base_url, "--model", "m", "--session-id", "demo-1",
         "--tool-s", "0.01", "--approval-s", "0.01"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "suspended for approval" in out and "sub-agent demo-1.review" in out
    sessions = [t["session_id"] for t in sidecar.upstream.tenure()]
    assert sessions.count("a/demo-1") == 4 and "a/demo-1.review" in sessions
    assert sidecar.upstream.tenure()[-1]["last_turn"] is True


def test_unused_session_exits_cleanly(sidecar: Sidecar) -> None:
    with TenureSession(_client(sidecar), session_id="agent-9") as s:
        assert s.turns == 0
    assert sidecar.upstream.bodies == []
