"""``/v1/messages``: the Anthropic Messages API (Claude Code's), tracked like chat.

vLLM serves this route itself (``vllm.entrypoints.anthropic``: it turns the request into a chat
request and takes ``kv_transfer_params`` as chat does), so the proxy forwards the body with
its ``kv_transfer_params.tenure`` added and relays the answer, SSE events included, byte for
byte. What this module reads:

* the session: ``X-Tenure-Session`` (or a dialect, :mod:`tenure.service.api.hints.dialects`), else
  the session a harness put in ``metadata.user_id`` (Claude Code's
  ``user_<hash>_account_<uuid>_session_<uuid>``, or a JSON object with ``session_id``), else
  one inferred from the message prefix as for chat. A plain ``user_id`` names a user, not a
  session, and is not used (all of one user's conversations would merge);
* the gap from ``stop_reason``: ``tool_use`` -> a tool's seconds, ``end_turn`` /
  ``stop_sequence`` / ``max_tokens`` / ``refusal`` -> a human's minutes, ``pause_turn`` (the
  harness continues at once) -> the tool class;
* ``cache_control`` breakpoints (system, tools, message blocks) with their ``ttl`` (``"5m"``
  by default, ``"1h"``): the longest is forwarded as ``retention_s``, each one is kept in
  :class:`MessagesInfo` with the prefix it marks;
* ``thinking`` / ``redacted_thinking`` blocks of earlier assistant turns: reasoning segments
  (:class:`ReasoningSpan`), for placement.

Errors on this route are Anthropic's: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.responses import Response

from tenure.service.api.hints.dialects import Found, retention_seconds, session_key
from tenure.service.api.hints.inference import prefix_digests
from tenure.service.api.shapes.base import Prepared, RouteInputError, TurnScan, usage_fields
from tenure.service.api.upstream.client import UpstreamError
from tenure.service.api.upstream.relay import stream_cut_reason

__all__ = [
    "CacheBreakpoint",
    "MessagesInfo",
    "MessagesShape",
    "ReasoningSpan",
    "anthropic_error",
    "inspect",
    "recorded_items",
    "session_from_user_id",
]

_encode = msgspec.json.Encoder().encode
_STOP = re.compile(rb'"stop_reason"\s*:\s*"([A-Za-z_]{1,32})"')
_TOOL = re.compile(rb'"type"\s*:\s*"tool_use"[^{}]{0,400}?"name"\s*:\s*"([^"\\]{1,128})"')
#: The usage counts of a Messages answer (streamed: ``message_start`` and ``message_delta``).
_USAGE = re.compile(
    rb'"((?:cache_read_|cache_creation_)?input_tokens|output_tokens)"\s*:\s*([0-9]{1,12})'
)
_CLAUDE_CODE_SESSION = re.compile(r"_session_([A-Za-z0-9][A-Za-z0-9-]{7,127})$")
#: Anthropic's error ``type`` by status.
_KINDS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
_REASONING = frozenset({"thinking", "redacted_thinking"})


def anthropic_error(
    status: int, message: str, *, headers: dict[str, str] | None = None
) -> Response:
    kind = _KINDS.get(status, "api_error" if status >= 500 else "invalid_request_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return Response(
        _encode(body), status_code=status, media_type="application/json", headers=headers
    )


@dataclass(frozen=True, slots=True)
class ReasoningSpan:
    """A thinking block of an earlier assistant turn: a reasoning segment of the prefix."""

    message_index: int
    block_index: int
    kind: str  # "thinking" | "redacted_thinking"
    chars: int


@dataclass(frozen=True, slots=True)
class CacheBreakpoint:
    """A ``cache_control`` marker: the prefix through this block is asked to live ``ttl_s``.

    ``where`` is ``"tools"``, ``"system"`` or ``"messages"``; ``index``/``block`` locate it
    (``block`` -1 for a tool or a whole string).
    """

    where: str
    index: int
    block: int
    ttl_s: float


@dataclass(frozen=True, slots=True)
class MessagesInfo:
    """The typed reading of one request, for consumers (segment placement, TTL control)."""

    reasoning: tuple[ReasoningSpan, ...] = ()
    breakpoints: tuple[CacheBreakpoint, ...] = ()
    thinking_enabled: bool = False

    @property
    def retention_s(self) -> float | None:
        return max((b.ttl_s for b in self.breakpoints), default=None)


def session_from_user_id(user_id: str) -> str | None:
    """The session a harness put in ``metadata.user_id``, or None if it holds only a user."""
    stripped = user_id.strip()
    if stripped.startswith("{"):
        try:
            decoded = json.loads(stripped)
        except ValueError:
            return None
        value = decoded.get("session_id") if isinstance(decoded, dict) else None
        return session_key(value) if isinstance(value, str) else None
    match = _CLAUDE_CODE_SESSION.search(stripped)
    return session_key(match.group(1)) if match else None


def _cache_ttl(obj: object, param: str) -> float | None:
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise RouteInputError(param, f"{param} must be an object")
    if obj.get("type", "ephemeral") != "ephemeral":
        raise RouteInputError(f"{param}.type", f"{param}.type must be 'ephemeral'")
    if "ttl" not in obj or obj["ttl"] is None:
        return 300.0
    ttl = obj["ttl"]
    seconds = retention_seconds(ttl) if isinstance(ttl, str) else None
    if seconds is None:
        raise RouteInputError(
            f"{param}.ttl", f"{param}.ttl must be a duration such as '5m' or '1h'"
        )
    return seconds


def _blocks(
    content: object, param: str, where: str, index: int, found: list[CacheBreakpoint]
) -> list[Any] | None:
    if content is None or isinstance(content, str):
        return None
    if not isinstance(content, list):
        raise RouteInputError(param, f"{param} must be a string or a list of content blocks")
    for b, block in enumerate(content):
        if not isinstance(block, dict):
            raise RouteInputError(f"{param}.{b}", f"{param}.{b} must be an object")
        if "cache_control" in block:
            ttl = _cache_ttl(block["cache_control"], f"{param}.{b}.cache_control")
            if ttl is not None:
                found.append(CacheBreakpoint(where, index, b, ttl))
    return content


def inspect(payload: Mapping[str, Any]) -> MessagesInfo:
    """Check the fields this route reads and return its typed reading (raises
    :class:`RouteInputError` naming the first bad field)."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        raise RouteInputError("messages", "messages must be a list of messages")
    breakpoints: list[CacheBreakpoint] = []
    reasoning: list[ReasoningSpan] = []
    tools = payload.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise RouteInputError("tools", "tools must be a list")
        for t, tool in enumerate(tools):
            if isinstance(tool, dict) and "cache_control" in tool:
                ttl = _cache_ttl(tool["cache_control"], f"tools.{t}.cache_control")
                if ttl is not None:
                    breakpoints.append(CacheBreakpoint("tools", t, -1, ttl))
    _blocks(payload.get("system"), "system", "system", 0, breakpoints)
    for m, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RouteInputError(f"messages.{m}", f"messages.{m} must be an object")
        if not isinstance(message.get("role"), str):
            raise RouteInputError(f"messages.{m}.role", f"messages.{m}.role must be a string")
        blocks = _blocks(
            message.get("content"), f"messages.{m}.content", "messages", m, breakpoints
        )
        if blocks and message["role"] == "assistant":
            for b, block in enumerate(blocks):
                kind = block.get("type")
                if kind in _REASONING:
                    text = block.get("thinking") if kind == "thinking" else block.get("data")
                    size = len(text) if isinstance(text, str) else 0
                    reasoning.append(ReasoningSpan(m, b, kind, size))
    thinking = payload.get("thinking")
    enabled = isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
    return MessagesInfo(tuple(reasoning), tuple(breakpoints), enabled)


def _metadata_session(payload: Mapping[str, Any]) -> str | None:
    metadata = payload.get("metadata")
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise RouteInputError("metadata", "metadata must be an object")
    user_id = metadata.get("user_id")
    if user_id is None:
        return None
    if not isinstance(user_id, str):
        raise RouteInputError("metadata.user_id", "metadata.user_id must be a string")
    if len(user_id) > 256:
        raise RouteInputError("metadata.user_id", "metadata.user_id must be at most 256 characters")
    return session_from_user_id(user_id)


def _unmarked(content: object) -> object:
    """Content without its ``cache_control`` markers: harnesses move the breakpoint to the
    newest message each turn, and the prefix must hash the same either way."""
    if not isinstance(content, list):
        return content
    return [
        {k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b
        for b in content
    ]


def recorded_items(payload: Mapping[str, Any]) -> list[Any]:
    """What a recording hashes for this request's prefix structure, in prompt order: the
    tools, the system prompt, the messages, without ``cache_control`` markers."""
    items: list[Any] = []
    tools = payload.get("tools")
    if isinstance(tools, list) and tools:
        items.append({"tools": _unmarked(tools)})
    system = payload.get("system")
    if system is not None:
        items.append({"system": _unmarked(system)})
    for message in payload.get("messages") or ():
        if isinstance(message, dict):
            items.append(
                {"role": message.get("role"), "content": _unmarked(message.get("content"))}
            )
    return items


def digests_of(payload: Mapping[str, Any]) -> list[str]:
    messages: Sequence[Any] = payload.get("messages") or []
    chain: list[Any] = []
    system = payload.get("system")
    if system is not None:
        chain.append({"system": _unmarked(system)})
    for message in messages:
        chain.append({"role": message.get("role"), "content": _unmarked(message.get("content"))})
    # Only a conversation (a message to continue) is worth inferring.
    return prefix_digests(payload.get("model"), chain) if messages else []


class MessagesShape:
    name = "messages"
    path = "/v1/messages"
    #: Claude Code's sub-agents are spawned here (issue 24): their worker class and spawn
    #: record come from segment tracking.
    tracks_segments = True
    chat_messages = True

    def error(
        self,
        status: int,
        message: str,
        *,
        type_: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> Response:
        # Anthropic's error type follows from the status alone (``_KINDS``).
        if param and param != "body" and not message.startswith(param):
            message = f"{param}: {message}"
        return anthropic_error(status, message)

    def prepare(self, payload: dict[str, Any], headers: Mapping[str, str]) -> Prepared:
        info = inspect(payload)
        session = _metadata_session(payload)
        native = Found(session=session, retention_s=info.retention_s)
        return Prepared(native=native, infer=lambda: digests_of(payload), info=info)

    def scan_body(self, turn: TurnScan, content: bytes) -> None:
        try:
            answer = msgspec.json.decode(content)
        except msgspec.DecodeError:
            return
        if not isinstance(answer, dict):
            return
        stop = answer.get("stop_reason")
        if isinstance(stop, str):
            turn.stop_reason = stop
        if turn.recording:
            turn.usage = usage_fields(answer.get("usage"))
        for block in answer.get("content") or ():
            if isinstance(block, dict) and block.get("type") == "tool_use":
                name = block.get("name")
                if isinstance(name, str):
                    turn.tool = name
                break

    def scan_chunk(self, turn: TurnScan, chunk: bytes) -> None:
        if b"stop_reason" in chunk:
            for match in _STOP.finditer(chunk):
                turn.stop_reason = match.group(1).decode()
                turn.answered = True
        if turn.tool is None and b"tool_use" in chunk:
            found = _TOOL.search(chunk)
            if found is not None:
                turn.tool = found.group(1).decode(errors="replace")
        if turn.recording and b'"usage"' in chunk:
            # message_start has the input counts, message_delta the final output count.
            usage = turn.usage if turn.usage is not None else {}
            for key, value in _USAGE.findall(chunk):
                usage[key.decode().removesuffix("_tokens")] = int(value)
            turn.usage = usage

    def stream_error(self, exc: UpstreamError) -> bytes:
        # Anthropic's own error event: the official clients raise on it.
        message, _code = stream_cut_reason(exc)
        body = _encode({"type": "error", "error": {"type": "api_error", "message": message}})
        return b"event: error\ndata: " + body + b"\n\n"
