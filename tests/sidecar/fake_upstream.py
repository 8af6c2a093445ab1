"""A small real OpenAI-compatible HTTP server standing in for vLLM (a boundary we do not own).

It records every request it receives (headers and JSON body) and behaves by model name:

* ``echo`` (default): a completion with ``finish_reason`` ``stop``;
* ``tool``: ``finish_reason`` ``tool_calls`` with a tool call to ``run_tests``;
* ``error``: 400 with an OpenAI error body (kept as is by the proxy);
* ``missing``: 404 with an OpenAI error body (vLLM's answer for an unknown model);
* ``die``: streams one chunk, then the server fails and drops the connection mid-answer;
* ``slow``: answers after ``slow_s`` seconds (upstream timeouts);
* ``hang``: streams one chunk (or, not streaming, nothing), then waits until the client goes
  away (records the cancellation).

Streaming requests get SSE chunks.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send

__all__ = ["FakeUpstream", "ServerThread", "free_port"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeUpstream:
    slow_s: float = 3.0
    received: list[Received] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.received.append(Received(scope["path"], headers, body))
        if scope["path"] == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": "echo"}]})
            return
        model = body.get("model", "echo") if isinstance(body, dict) else "echo"
        if model == "error":
            await _json(send, 400, {"error": {"message": "bad model", "type": "BadRequestError"}})
            return
        if model == "missing":
            message = {"message": "The model `missing` does not exist.", "type": "NotFoundError"}
            await _json(send, 404, {"error": message, "code": 404})
            return
        if model == "slow":
            await asyncio.sleep(self.slow_s)
        finish = "tool_calls" if model == "tool" else "stop"
        stream = isinstance(body, dict) and body.get("stream")
        usage = {"prompt_tokens": _words(body), "completion_tokens": 3}
        if model == "hang" and not stream:
            while True:  # never answers; notices when the proxy drops the request
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.cancelled.set()
                    return
        if not stream:
            message_body: dict[str, Any] = {"role": "assistant", "content": "hi"}
            if model == "tool":
                message_body["tool_calls"] = [
                    {"id": "c1", "type": "function",
                     "function": {"name": "run_tests", "arguments": "{}"}}
                ]  # fmt: skip
            await _json(
                send,
                200,
                {
                    "id": "cmpl-1",
                    "object": "chat.completion",
                    "model": model,
                    "choices": [{"index": 0, "message": message_body, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        if model == "die":
            await send({"type": "http.response.body", "body": _sse({"n": 0}), "more_body": True})
            raise RuntimeError("the engine died mid-stream")  # uvicorn drops the connection
        if model == "hang":
            await send({"type": "http.response.body", "body": _sse({"n": 0}), "more_body": True})
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.cancelled.set()
                    return
        for i in range(3):
            delta: dict[str, Any] = {"content": f"t{i}"}
            if model == "tool" and i == 0:
                delta = {"tool_calls": [{"index": 0, "function": {"name": "run_tests"}}]}
            chunk = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            await send({"type": "http.response.body", "body": _sse(chunk), "more_body": True})
        last = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        await send({"type": "http.response.body", "body": _sse(last), "more_body": True})
        if isinstance(body, dict) and (body.get("stream_options") or {}).get("include_usage"):
            tail = {"choices": [], "usage": usage}
            await send({"type": "http.response.body", "body": _sse(tail), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _words(body: Any) -> int:
    """Prompt "tokens" of a chat body: whitespace-separated words of its messages."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _json(send: Send, status: int, obj: Any) -> None:
    body = json.dumps(obj).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class ServerThread:
    """Run an ASGI app under uvicorn on a free loopback port in a background thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="auto",
            timeout_graceful_shutdown=2,
        )  # fmt: skip
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
