"""Fixtures for SDK tests that need no sidecar: a recording fake of its HTTP surface.

The sidecar is our own service and has its own integration tests (and the SDK is tested
against the real one in ``test_sdk_against_sidecar.py``); here the fake stands in at the
network boundary only, to drive the SDK into corners a healthy sidecar never shows (503 with
Retry-After, connection refused, error bodies).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import httpx2
import openai
import pytest

BASE_URL = "http://sidecar.test/v1"
API_KEY = "sk-test-tenant-a"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeSidecar:
    """Records every request; answers completions and lifecycle calls like the sidecar would."""

    api_key: str = API_KEY
    seen: list[Seen] = field(default_factory=list)
    #: Queue of (status, headers) to answer the next lifecycle calls with, before normal service.
    lifecycle_failures: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    refuse_connections: int = 0

    def handle(
        self, method: str, path: str, headers: dict[str, str], raw: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        body: Any = json.loads(raw) if raw else None
        self.seen.append(Seen(method, path, headers, body))
        if path.endswith("/chat/completions"):
            return self._chat(body)
        if path.endswith("/completions"):
            return 200, {"content-type": "application/json"}, json.dumps(_completion()).encode()
        if self.lifecycle_failures:
            status, extra = self.lifecycle_failures.pop(0)
            payload = {"error": {"message": "redis unavailable", "type": "unavailable"}}
            return (
                status,
                {"content-type": "application/json", **extra},
                json.dumps(payload).encode(),
            )
        parts = path.strip("/").split("/")  # v1 sessions ID [action]
        session_id = parts[2]
        action = parts[3] if len(parts) > 3 else "info"
        answer: dict[str, Any] = {"session_id": session_id, "action": action}
        if action == "workers":
            answer = {"session_id": body["worker_id"], "parent": session_id}
        return 200, {"content-type": "application/json"}, json.dumps(answer).encode()

    def _chat(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        if body.get("stream"):
            chunks = [_chunk("he"), _chunk("llo"), "[DONE]"]
            text = "".join(
                f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks
            )
            return 200, {"content-type": "text/event-stream"}, text.encode()
        return 200, {"content-type": "application/json"}, json.dumps(_chat_completion()).encode()

    def of(self, suffix: str) -> list[Seen]:
        return [s for s in self.seen if s.path.endswith(suffix)]


def _chat_completion() -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }


def _chunk(text: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
    }


def _completion() -> dict[str, Any]:
    return {
        "id": "t1",
        "object": "text_completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "stop", "logprobs": None}],
    }


def _handler(fake: FakeSidecar, module: Any) -> Callable[[Any], Any]:
    def handle(request: Any) -> Any:
        if fake.refuse_connections > 0:
            fake.refuse_connections -= 1
            raise module.ConnectError("connection refused", request=request)
        status, headers, content = fake.handle(
            request.method, request.url.path, dict(request.headers), request.content
        )
        return module.Response(status, headers=headers, content=content)

    return handle


@pytest.fixture
def fake_sidecar() -> FakeSidecar:
    return FakeSidecar()


@pytest.fixture
def sync_clients(fake_sidecar: FakeSidecar) -> tuple[openai.OpenAI, httpx.Client]:
    # openai routes through httpx2; the SDK's lifecycle calls through httpx: one fake for both.
    oa = openai.OpenAI(
        api_key=API_KEY,
        base_url=BASE_URL,
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(_handler(fake_sidecar, httpx2))),
    )
    http = httpx.Client(transport=httpx.MockTransport(_handler(fake_sidecar, httpx)))
    return oa, http


@pytest.fixture
def async_clients(fake_sidecar: FakeSidecar) -> tuple[openai.AsyncOpenAI, httpx.AsyncClient]:
    oa = openai.AsyncOpenAI(
        api_key=API_KEY,
        base_url=BASE_URL,
        max_retries=0,
        http_client=httpx2.AsyncClient(
            transport=httpx2.MockTransport(_handler(fake_sidecar, httpx2))
        ),
    )
    http = httpx.AsyncClient(transport=httpx.MockTransport(_handler(fake_sidecar, httpx)))
    return oa, http
