"""A scripted model server that answers like an agent: one shell tool call, then a short answer.

A small real HTTP server (an ASGI app under uvicorn) standing in for the engine behind
``tenure serve`` when the real Claude Code and Codex CLIs run through it. It speaks the three
APIs those harnesses use, streaming included: Anthropic Messages (``/v1/messages``), OpenAI
Responses (``/v1/responses``) and OpenAI Chat Completions (``/v1/chat/completions``).

The script, by what the conversation holds:

* the newest input is a tool's result -> a short text answer (``end_turn`` / ``stop`` /
  a completed response);
* else, when the prompt asks for a sub-agent (``[spawn]``) and the request offers Claude
  Code's ``Agent`` (or older ``Task``) tool -> a call of it with a prompt for the child; when
  it offers Codex's multi-agent tools (the ``multi_agent_v1`` namespace) -> ``spawn_agent``
  with that prompt, and once its result (the child's ``agent_id``) is back, ``wait_agent`` on
  the child, so the lead waits for it as for a foreground child;
* else, when the request offers a shell tool (``Bash``, ``shell``, ``exec_command``,
  ``local_shell``) -> one call of it (``echo tenure-ok``);
* else (a side request: a title, a quota probe) -> a short text answer.

Every request is recorded as it arrived (path, headers, JSON body, time), which is what the
tests read back to see what each CLI sends. ``faults`` injects the failures the tests need:
``"500"`` answers the next matching request with an error status, ``"cut"`` streams its first
events and then drops the connection.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

__all__ = ["Received", "ScriptedEngine", "is_tool_result_turn", "shell_tool"]

SHELL_COMMAND = "echo tenure-ok"
CHILD_PROMPT = "Run `echo tenure-ok` in a shell and report what it printed. [child]"
_SHELL_TOOLS = ("Bash", "shell", "exec_command", "local_shell", "shell_command")
_AGENT_TOOLS = ("Agent", "Task")
#: Codex's multi-agent tools: a namespace tool whose calls name it beside the function.
CODEX_AGENTS = "multi_agent_v1"


@dataclass(slots=True)
class Received:
    path: str
    headers: dict[str, str]
    body: Any
    at: float
    #: What the script answered: "tool:<name>", "text", or a fault ("500", "cut").
    answer: str = ""


@dataclass
class ScriptedEngine:
    received: list[Received] = field(default_factory=list)
    #: Faults for the next requests to the model routes, taken in order.
    faults: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ids: int = 0

    def model_requests(self) -> list[Received]:
        return [r for r in self.received if r.path.startswith(_MODEL_PATHS)]

    def _next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await Request(scope, receive).body()
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        record = Received(scope["path"], headers, body, time.time())
        with self._lock:
            self.received.append(record)
        path = scope["path"]
        if path.endswith("/models") and scope["method"] == "GET":
            await _json(
                send, 200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
            )
            return
        if not path.startswith(_MODEL_PATHS) or not isinstance(body, dict):
            if path.endswith("/count_tokens") and isinstance(body, dict):
                await _json(send, 200, {"input_tokens": len(json.dumps(body)) // 4})
                return
            await _json(send, 404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        fault = ""
        with self._lock:
            if self.faults:
                fault = self.faults.pop(0)
        plan = _plan(path, body)
        record.answer = fault or plan.label
        if fault == "500":
            await _json(send, 500, _error_body(path, "scripted failure"))
            return
        streamed = bool(body.get("stream"))
        number = self._next_id()
        # Prompt tokens as a tokenizer would roughly count the request (4 bytes a token), so a
        # recording of these runs has the CLIs' real prompt sizes.
        prompt = max(1, len(raw) // 4)
        if path == "/v1/messages":
            await _anthropic(send, plan, streamed, number, prompt, cut=fault == "cut")
        elif path == "/v1/responses":
            await _responses(send, plan, streamed, number, prompt, cut=fault == "cut")
        else:
            await _chat(send, plan, streamed, number, prompt, cut=fault == "cut")


_MODEL_PATHS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


@dataclass(frozen=True, slots=True)
class Plan:
    """What the script answers: a tool call (``tool`` with ``arguments``) or ``text``."""

    tool: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    #: The tool namespace a Responses function call names (Codex's ``multi_agent_v1``).
    namespace: str = ""

    @property
    def label(self) -> str:
        return f"tool:{self.tool}" if self.tool else "text"


def _tool_names(body: dict[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        name = tool.get("name")
        if name is None and isinstance(tool.get("function"), dict):
            name = tool["function"].get("name")
        if name is None and tool.get("type") == "local_shell":
            name = "local_shell"
        if isinstance(name, str):
            names.append(name)
    return names


def shell_tool(names: Sequence[str]) -> str | None:
    for name in _SHELL_TOOLS:
        if name in names:
            return name
    return None


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return " ".join(_text_of(v) for v in value)
    if isinstance(value, dict):
        return " ".join(_text_of(v) for k, v in value.items() if k in ("text", "content"))
    return ""


def is_tool_result_turn(path: str, body: dict[str, Any]) -> bool:
    """Whether the newest input of the conversation is a tool's result."""
    if path == "/v1/messages":
        # Claude Code may append system-role messages after a tool's result.
        messages = [m for m in body.get("messages") or [] if m.get("role") != "system"]
        if not messages:
            return False
        last = messages[-1]
        content = last.get("content") if isinstance(last, dict) else None
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )
    if path == "/v1/responses":
        items = body.get("input")
        if not isinstance(items, list) or not items:
            return False
        last = items[-1]
        return isinstance(last, dict) and str(last.get("type", "")).endswith("_call_output")
    messages = body.get("messages") or []
    return bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"


def _latest_user_text(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/responses":
        items = body.get("input")
        if isinstance(items, str):
            return items
        for item in reversed(items or []):
            if isinstance(item, dict) and item.get("role") == "user":
                return _text_of(item.get("content"))
        return ""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _spawned_agent(path: str, body: dict[str, Any]) -> str | None:
    """The ``agent_id`` when the newest input is Codex's ``spawn_agent`` result."""
    items = body.get("input") if path == "/v1/responses" else None
    if not isinstance(items, list) or not items or not isinstance(items[-1], dict):
        return None
    try:
        output = json.loads(items[-1].get("output") or "")
    except (TypeError, ValueError):
        return None
    agent = output.get("agent_id") if isinstance(output, dict) else None
    return agent if isinstance(agent, str) else None


def _plan(path: str, body: dict[str, Any]) -> Plan:
    if is_tool_result_turn(path, body):
        agent = _spawned_agent(path, body)
        if agent is not None:
            wait = {"targets": [agent], "timeout_ms": 60_000}
            return Plan(tool="wait_agent", arguments=wait, namespace=CODEX_AGENTS)
        return Plan(text="Done: the shell printed tenure-ok.")
    names = _tool_names(body)
    prompt = _latest_user_text(path, body)
    if "SYSTEM NOTIFICATION" in prompt:
        return Plan(text="Noted.")  # a harness's own event (a background task ended)
    if "<subagent_notification>" in prompt:
        # Codex tells the lead its child finished (after ``wait_agent`` returned).
        return Plan(text="Done: the shell printed tenure-ok.")
    if "[spawn]" in prompt and "[child]" not in prompt:
        agent = next((n for n in _AGENT_TOOLS if n in names), None)
        if agent is not None:
            return Plan(
                tool=agent,
                arguments={
                    "description": "Check the shell",
                    "prompt": CHILD_PROMPT,
                    "subagent_type": "general-purpose",
                    # A foreground child: the lead waits for its answer.
                    "run_in_background": False,
                },
            )
        if CODEX_AGENTS in names:
            return Plan(
                tool="spawn_agent", arguments={"message": CHILD_PROMPT}, namespace=CODEX_AGENTS
            )
    shell = shell_tool(names)
    if shell is None:
        return Plan(text="ok")
    if shell == "Bash":
        arguments: dict[str, Any] = {"command": SHELL_COMMAND, "description": "Print a marker"}
    elif shell in ("exec_command", "shell_command"):
        arguments = (
            {"cmd": SHELL_COMMAND} if shell == "exec_command" else {"command": SHELL_COMMAND}
        )
    else:
        arguments = {"command": ["bash", "-lc", SHELL_COMMAND]}
    return Plan(tool=shell, arguments=arguments)


# --- the wire formats ------------------------------------------------------------------------


def _error_body(path: str, message: str) -> dict[str, Any]:
    if path == "/v1/messages":
        return {"type": "error", "error": {"type": "api_error", "message": message}}
    return {"error": {"message": message, "type": "server_error", "code": None, "param": None}}


async def _json(send: Send, status: int, body: dict[str, Any]) -> None:
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def _sse_start(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }
    )


async def _events(send: Send, events: list[bytes], cut: bool) -> None:
    """Send SSE events; a cut sends the first two and then fails the connection."""
    if cut:
        for event in events[:2]:
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await asyncio.sleep(0.05)
        raise ConnectionResetError("scripted cut")  # uvicorn drops the connection mid-answer
    for event in events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _named(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


def _data(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    return f"data: {text}\n\n".encode()


async def _anthropic(
    send: Send, plan: Plan, streamed: bool, number: int, prompt: int, *, cut: bool
) -> None:
    msg_id = f"msg_scripted_{number:05d}"
    usage = {"input_tokens": prompt, "output_tokens": 12}
    if plan.tool:
        block: dict[str, Any] = {
            "type": "tool_use", "id": f"toolu_scripted_{number:05d}", "name": plan.tool,
            "input": plan.arguments,
        }  # fmt: skip
        stop = "tool_use"
    else:
        block = {"type": "text", "text": plan.text}
        stop = "end_turn"
    message = {
        "id": msg_id, "type": "message", "role": "assistant", "model": "scripted",
        "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage,
    }  # fmt: skip
    if not streamed:
        await _json(send, 200, message)
        return
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events = [
        _named("message_start", {"type": "message_start", "message": start}),
    ]
    if plan.tool:
        events.append(
            _named(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {**block, "input": {}},
                },
            )
        )
        delta = {"type": "input_json_delta", "partial_json": json.dumps(plan.arguments)}
    else:
        events.append(
            _named(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            )
        )
        delta = {"type": "text_delta", "text": plan.text}
    events += [
        _named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
        _named("content_block_stop", {"type": "content_block_stop", "index": 0}),
        _named(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 12},
            },
        ),
        _named("message_stop", {"type": "message_stop"}),
    ]
    await _sse_start(send)
    await _events(send, events, cut)


async def _responses(
    send: Send, plan: Plan, streamed: bool, number: int, prompt: int, *, cut: bool
) -> None:
    resp_id = f"resp_scripted_{number:05d}"
    if plan.tool:
        item: dict[str, Any] = {
            "type": "function_call", "id": f"fc_scripted_{number:05d}",
            "call_id": f"call_scripted_{number:05d}", "name": plan.tool,
            "arguments": json.dumps(plan.arguments), "status": "completed",
        }  # fmt: skip
        if plan.namespace:
            item["namespace"] = plan.namespace
    else:
        item = {
            "type": "message", "id": f"msg_scripted_{number:05d}", "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": plan.text, "annotations": []}],
        }  # fmt: skip
    usage = {
        "input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + 12,
    }  # fmt: skip
    response = {
        "id": resp_id, "object": "response", "created_at": int(time.time()), "model": "scripted",
        "status": "completed", "output": [item], "usage": usage,
    }  # fmt: skip
    if not streamed:
        await _json(send, 200, response)
        return
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    seq = iter(range(1000))
    events = [
        _named("response.created", {"type": "response.created", "sequence_number": next(seq),
                                    "response": pending}),
        _named("response.in_progress", {"type": "response.in_progress",
                                        "sequence_number": next(seq), "response": pending}),
        _named("response.output_item.added", {"type": "response.output_item.added",
                                              "sequence_number": next(seq), "output_index": 0,
                                              "item": {**item, "status": "in_progress"}}),
    ]  # fmt: skip
    if not plan.tool:
        events.append(
            _named("response.output_text.delta", {"type": "response.output_text.delta",
                                                  "sequence_number": next(seq),
                                                  "item_id": item["id"], "output_index": 0,
                                                  "content_index": 0, "delta": plan.text})
        )  # fmt: skip
    events += [
        _named("response.output_item.done", {"type": "response.output_item.done",
                                             "sequence_number": next(seq), "output_index": 0,
                                             "item": item}),
        _named("response.completed", {"type": "response.completed",
                                      "sequence_number": next(seq), "response": response}),
    ]  # fmt: skip
    await _sse_start(send)
    await _events(send, events, cut)


async def _chat(
    send: Send, plan: Plan, streamed: bool, number: int, prompt: int, *, cut: bool
) -> None:
    chat_id = f"chatcmpl-scripted-{number:05d}"
    if plan.tool:
        call = {
            "id": f"call_scripted_{number:05d}", "type": "function",
            "function": {"name": plan.tool, "arguments": json.dumps(plan.arguments)},
        }  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
        finish = "tool_calls"
    else:
        message = {"role": "assistant", "content": plan.text}
        finish = "stop"
    usage = {"prompt_tokens": prompt, "completion_tokens": 12, "total_tokens": prompt + 12}
    if not streamed:
        await _json(
            send,
            200,
            {"id": chat_id, "object": "chat.completion", "created": int(time.time()),
             "model": "scripted", "usage": usage,
             "choices": [{"index": 0, "message": message, "finish_reason": finish}]},
        )  # fmt: skip
        return
    base = {"id": chat_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": "scripted"}  # fmt: skip
    delta: dict[str, Any] = {"role": "assistant"}
    if plan.tool:
        delta["tool_calls"] = [{"index": 0, **message["tool_calls"][0]}]
    else:
        delta["content"] = plan.text
    events = [
        _data({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}),
        _data({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
               "usage": usage}),
        _data("[DONE]"),
    ]  # fmt: skip
    await _sse_start(send)
    await _events(send, events, cut)
