"""A small real OpenAI-compatible HTTP server standing in for vLLM (a boundary we do not own).

It records every request it receives (headers and JSON body) and behaves by model name:

* ``echo`` (default): a completion with ``finish_reason`` ``stop``;
* ``tool``: ``finish_reason`` ``tool_calls`` with a tool call to ``run_tests``;
* ``error``: 400 with an OpenAI error body (kept as is by the proxy);
* ``missing``: 404 with an OpenAI error body (vLLM's answer for an unknown model);
* ``die``: streams one chunk, then the server fails and drops the connection mid-answer;
* ``slow``: answers after ``slow_s`` seconds (upstream timeouts);
* ``hang``: streams one chunk (or, not streaming, nothing), then waits until the client goes
  away (records the cancellation);
* ``linger``: streams the whole answer, its finish reason included, then holds the stream
  open (no ``[DONE]``) until the client goes away: a client that leaves on the answer's end
  before the engine closes the stream;
* ``reasoning``: a reasoning model's answer (``message.reasoning`` beside the content) with
  ``usage`` (``reasoning_tokens`` included), counted as :func:`prompt_tokens` renders;
  ``POST /tokenize`` counts a chat prompt the same way (vLLM's route).

Streaming requests get SSE chunks. Prompt "tokens" are whitespace-separated words of the
request's text (chat: its messages; ``/v1/messages``: the system prompt and the messages, half
of them reported as cache reads, as vLLM reports a prefix hit in Anthropic's usage;
``/v1/responses``: the instructions and the input, plus the whole stored conversation a
``previous_response_id`` continues, as the engine's prompt holds it); answers are 3 tokens.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.requests import Request
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
    #: The query string it came with (``""``: none).
    query: str = ""


@dataclass
class FakeUpstream:
    slow_s: float = 3.0
    received: list[Received] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    #: Responses answered so far (their ids are ``resp_<n>``).
    responses: int = 0
    #: Prompt plus answer tokens of each Responses answer (what a request continuing it adds).
    conversation_tokens: dict[str, int] = field(default_factory=dict)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await Request(scope, receive).body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.received.append(
            Received(scope["path"], headers, body, scope.get("query_string", b"").decode())
        )
        if scope["path"] == "/tokenize" and isinstance(body, dict):
            await _json(send, 200, {"count": prompt_tokens(body.get("messages") or [])})
            return
        if scope["path"] == "/v1/models":
            await _json(send, 200, {"object": "list", "data": [{"id": "echo"}]})
            return
        model = body.get("model", "echo") if isinstance(body, dict) else "echo"
        if scope["path"] in ("/v1/messages", "/v1/responses") and not isinstance(model, str):
            # vLLM's request models refuse a non-string model with a 400 (a generated body
            # reaches here: the proxy relays what it cannot check to the engine).
            await _json(
                send,
                400,
                {"error": {"message": "model must be a string", "type": "BadRequestError"}},
            )
            return
        if scope["path"] in ("/v1/messages", "/v1/responses") and model not in _SPECIAL_MODELS:
            streamed = isinstance(body, dict) and bool(body.get("stream"))
            if scope["path"] == "/v1/messages":
                await _anthropic(send, model, streamed, _anthropic_words(body))
            else:
                self.responses += 1
                answer = f"resp_{self.responses:06d}"
                prompt = _responses_words(body)
                before = body.get("previous_response_id") if isinstance(body, dict) else None
                prompt += self.conversation_tokens.get(str(before), 0)
                self.conversation_tokens[answer] = prompt + 3
                await _responses(send, model, streamed, answer, prompt)
            return
        if model == "error":
            await _json(send, 400, {"error": {"message": "bad model", "type": "BadRequestError"}})
            return
        if model == "missing":
            error = {"message": "The model `missing` does not exist.", "type": "NotFoundError"}
            await _json(send, 404, {"error": error, "code": 404})
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
        if model == "reasoning" and not stream and isinstance(body, dict):
            await _json(send, 200, reasoning_answer(body.get("messages") or []))
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
        if model == "linger":
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.cancelled.set()
                    return
        if isinstance(body, dict) and (body.get("stream_options") or {}).get("include_usage"):
            tail = {"choices": [], "usage": usage}
            await send({"type": "http.response.body", "body": _sse(tail), "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def prompt_tokens(messages: list[Any]) -> int:
    """Tokens of a chat prompt as a template like the tiny test model's renders it (one per
    word): ``<s>``, then ``role : content </s>`` per message (an assistant message that carries
    its reasoning back gets ``<think> reasoning </think>`` before its content, as reasoning
    models' templates render it), then ``assistant :``."""
    count = 1 + 2
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        count += 3 + len(content.split() if isinstance(content, str) else [])
        reasoning = message.get("reasoning")
        if isinstance(reasoning, str):
            count += 2 + len(reasoning.split())
    return count


def reasoning_answer(messages: list[Any]) -> dict[str, Any]:
    """A reasoning model's answer: 40 words of reasoning (different every turn), 12 of
    content; the completion counts both and the two think markers."""
    n = len(messages)
    reasoning = " ".join(f"r{n}x{i}" for i in range(40))
    content = " ".join(f"c{n}x{i}" for i in range(12))
    return {
        "id": "cmpl-r",
        "object": "chat.completion",
        "model": "reasoning",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, "reasoning": reasoning},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens(messages),
            "completion_tokens": 40 + 12 + 2,
            "total_tokens": prompt_tokens(messages) + 54,
            "completion_tokens_details": {"reasoning_tokens": 40},
        },
    }


_SPECIAL_MODELS = frozenset({"error", "missing", "die", "hang", "slow"})
#: Anthropic stop reason by model name on /v1/messages (default end_turn).
_ANTHROPIC_STOPS = {"tool": "tool_use", "pause": "pause_turn", "long": "max_tokens"}


async def _start(send: Send, content_type: bytes) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]}
    )


async def _events(send: Send, events: list[tuple[str, Any]]) -> None:
    """Server-sent events with ``event:`` lines (the Anthropic and Responses wire format)."""
    await _start(send, b"text/event-stream")
    for name, data in events:
        chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _anthropic(send: Send, model: str, stream: bool, prompt: int = 5) -> None:
    """An Anthropic Messages answer (vLLM's /v1/messages), whole or as its event stream."""
    stop = _ANTHROPIC_STOPS.get(model, "end_turn")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "hi"}]
    if stop == "tool_use":
        blocks.append({"type": "tool_use", "id": "toolu_1", "name": "run_tests", "input": {}})
    cached = prompt // 2
    usage = {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "output_tokens": 3}
    message = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model,
        "content": blocks, "stop_reason": stop, "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    if not stream:
        await _json(send, 200, message)
        return
    events: list[tuple[str, Any]] = [
        ("message_start", {"type": "message_start",
                           "message": {**message, "content": [], "stop_reason": None}}),
    ]  # fmt: skip
    for index, block in enumerate(blocks):
        start = {**block, "text": ""} if block["type"] == "text" else block
        events.append(
            ("content_block_start",
             {"type": "content_block_start", "index": index, "content_block": start})
        )  # fmt: skip
        delta = (
            {"type": "text_delta", "text": block["text"]}
            if block["type"] == "text"
            else {"type": "input_json_delta", "partial_json": "{}"}
        )
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        ("message_delta", {"type": "message_delta",
                           "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": 3}})
    )  # fmt: skip
    events.append(("message_stop", {"type": "message_stop"}))
    await _events(send, events)


async def _responses(
    send: Send, model: str, stream: bool, response_id: str, prompt: int = 5
) -> None:
    """An OpenAI Responses answer (vLLM's /v1/responses), whole or as its event stream."""
    if model == "tool":
        item: dict[str, Any] = {
            "type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "run_tests",
            "arguments": "{}", "status": "completed",
        }  # fmt: skip
    else:
        item = {
            "type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "hi", "annotations": []}],
        }  # fmt: skip
    status = "incomplete" if model == "long" else "completed"
    response = {
        "id": response_id, "object": "response", "created_at": 1, "model": model,
        "status": status, "output": [item], "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "usage": {"input_tokens": prompt, "output_tokens": 3,
                               "total_tokens": prompt + 3,
                               "input_tokens_details": {"cached_tokens": 0},
                               "output_tokens_details": {"reasoning_tokens": 0}},
    }  # fmt: skip
    if not stream:
        await _json(send, 200, response)
        return
    created = {**response, "status": "in_progress", "output": []}
    done = "response.incomplete" if status == "incomplete" else "response.completed"
    await _events(
        send,
        [
            ("response.created",
             {"type": "response.created", "sequence_number": 0, "response": created}),
            ("response.output_item.added",
             {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
              "item": item}),
            ("response.output_item.done",
             {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0,
              "item": item}),
            (done, {"type": done, "sequence_number": 3, "response": response}),
        ],
    )  # fmt: skip


def _words(body: Any) -> int:
    """Prompt "tokens" of a chat body: whitespace-separated words of its messages."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return 0
    return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))


def _text_words(content: Any) -> int:
    """Words of a content field: a string, or the ``text`` of its blocks."""
    if isinstance(content, str):
        return len(content.split())
    if isinstance(content, list):
        return sum(len(str(b.get("text", "")).split()) for b in content if isinstance(b, dict))
    return 0


def _anthropic_words(body: Any) -> int:
    if not isinstance(body, dict):
        return 0
    given = body.get("messages")
    messages: list[Any] = given if isinstance(given, list) else []
    return _text_words(body.get("system")) + sum(
        _text_words(m.get("content")) for m in messages if isinstance(m, dict)
    )


def _responses_words(body: Any) -> int:
    if not isinstance(body, dict):
        return 0
    given = body.get("input")
    items = given if isinstance(given, list) else [{"content": given}]
    return _text_words(body.get("instructions")) + sum(
        _text_words(i.get("content")) for i in items if isinstance(i, dict)
    )


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

    def __init__(
        self, app: Any, port: int | None = None, *, lifespan: Literal["auto", "on"] = "auto"
    ) -> None:
        self.port = port or free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", lifespan=lifespan,
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
