"""``/v1/responses``: the OpenAI Responses API (Codex's), tracked without inference.

A Responses conversation names itself: each request continues an earlier answer by
``previous_response_id`` (or a ``conversation``), so the session is chained exactly, never
guessed. Every answer's ``id`` is recorded against its session (:mod:`tenure.service.state.aliases`,
tenant-scoped), and a request whose ``previous_response_id`` this tenant never received is
refused (400, nothing forwarded, nothing stored): vLLM keeps stored responses for every
caller alike, so forwarding such an id could continue another tenant's conversation. With
Redis away a chained request is answered 503 for the same reason.

Precedence: ``X-Tenure-Session`` and the dialects first (:mod:`tenure.service.api.hints.dialects`),
then ``conversation`` or the chain, then ``prompt_cache_key``; a request with none of these starts
a new session (``r-<random>``). The gap comes from the answer's output items: a
``function_call`` (or another tool call) -> the tool class; an ``incomplete`` answer ->
``max_tokens``; otherwise ``stop`` (a human's turn). Streamed events are relayed as they come.
Errors are the OpenAI API's.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

from tenure.service.api.hints.dialects import Found, session_key
from tenure.service.api.shapes.base import (
    Prepared,
    RouteInputError,
    TurnScan,
    openai_error_shape,
    usage_fields,
)
from tenure.service.api.upstream.client import UpstreamError
from tenure.service.api.upstream.relay import stream_cut_reason

__all__ = [
    "ResponsesShape",
    "continued",
    "names_stored_responses",
    "recorded_items",
    "stored_response_id",
]

_MAX_ID = 256
_ID = re.compile(rb'"id"\s*:\s*"(resp[_-][A-Za-z0-9_-]{1,200})"')
_TOOL_CALL = re.compile(
    rb'"type"\s*:\s*"(?:function_call|custom_tool_call|mcp_call)"[^{}]{0,400}?'
    rb'"name"\s*:\s*"([^"\\]{1,128})"'
)
#: The usage counts of a Responses answer (streamed: in the final ``response`` object).
_USAGE = re.compile(rb'"(input_tokens|output_tokens)"\s*:\s*([0-9]{1,12})')
_TOOL_TYPES = frozenset({"function_call", "custom_tool_call", "mcp_call", "computer_call"})


_STORED = re.compile(r"^/v1/responses/([^/]{1,256})(?:/(?:cancel|input_items))?$")


def stored_response_id(path: str) -> str | None:
    """The response id of a ``/v1/responses/{id}`` path (read, cancel, input items), if any."""
    match = _STORED.match(path)
    return match.group(1) if match else None


def names_stored_responses(path: str) -> bool:
    """Whether ``path`` reaches the stored responses in any form: with its empty segments
    merged (as a front proxy or the engine's router may), it is ``/v1/responses`` or below.
    Only the canonical forms :func:`stored_response_id` reads are checked for their owner;
    every other form (a trailing or doubled slash, an id over 256 characters, an unknown
    sub-resource) is refused, never forwarded unchecked."""
    parts = [part for part in path.split("/") if part]
    return parts[:2] == ["v1", "responses"]


def _optional_str(payload: Mapping[str, Any], name: str) -> str | None:
    value = payload.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_ID:
        raise RouteInputError(name, f"{name} must be a non-empty string of at most 256 characters")
    return value


def _conversation(payload: Mapping[str, Any]) -> str | None:
    value = payload.get("conversation")
    if value is None:
        return None
    if isinstance(value, dict):
        value = value.get("id")
        if not isinstance(value, str):
            raise RouteInputError("conversation.id", "conversation.id must be a string")
    if not isinstance(value, str) or not value or len(value) > _MAX_ID:
        raise RouteInputError("conversation", "conversation must be an id or {'id': ...}")
    return value


def recorded_items(payload: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """What a recording hashes for this request's prefix structure: the head (the
    instructions and tools, which lead the prompt) and the input items (a string input is
    one user message)."""
    head: list[Any] = []
    for key in ("instructions", "tools"):
        if payload.get(key):
            head.append({key: payload[key]})
    given = payload.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        items = given
    else:
        items = []
    return head, items


def continued(payload: Mapping[str, Any]) -> str | None:
    """The stored conversation a request continues, as a recording names it (``resp:`` an
    answer id, ``conv:`` a conversation id); ``None``: it starts one. Checked by
    :meth:`ResponsesShape.prepare` before a recording reads it."""
    chain = payload.get("previous_response_id")
    if isinstance(chain, str) and chain:
        return f"resp:{chain}"
    conversation = payload.get("conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
    if isinstance(conversation, str) and conversation:
        return f"conv:{conversation}"
    return None


class ResponsesShape:
    name = "responses"
    path = "/v1/responses"
    #: Codex's sub-agent threads are spawned here (issue 24).
    tracks_segments = True
    chat_messages = False
    error = staticmethod(openai_error_shape)

    def prepare(self, payload: dict[str, Any], headers: Mapping[str, str]) -> Prepared:
        if "request_id" in payload:
            # vLLM takes it as the answer's id and the key of its response store, shared by
            # every tenant: a client naming another tenant's id would overwrite that answer.
            raise RouteInputError(
                "request_id", "request_id is not accepted: the engine assigns response ids"
            )
        chain = _optional_str(payload, "previous_response_id")
        conversation = _conversation(payload)
        if chain is not None and conversation is not None:
            raise RouteInputError(
                "conversation", "previous_response_id and conversation cannot both be given"
            )
        key = payload.get("prompt_cache_key")
        if key is not None and not isinstance(key, str):
            raise RouteInputError("prompt_cache_key", "prompt_cache_key must be a string")
        native = Found(session=session_key(conversation) if conversation else None)
        return Prepared(
            native=native,
            chain=chain,
            new_session=f"r-{uuid.uuid4().hex[:24]}",
        )

    def scan_body(self, turn: TurnScan, content: bytes) -> None:
        try:
            answer = msgspec.json.decode(content)
        except msgspec.DecodeError:
            return
        if isinstance(answer, dict):
            self._read_response(turn, answer)

    def _read_response(self, turn: TurnScan, answer: dict[str, Any]) -> None:
        answer_id = answer.get("id")
        if isinstance(answer_id, str) and 0 < len(answer_id) <= _MAX_ID:
            turn.answer_id = answer_id
        stop = "max_tokens" if answer.get("status") == "incomplete" else "stop"
        for item in answer.get("output") or ():
            if isinstance(item, dict) and item.get("type") in _TOOL_TYPES:
                stop = "function_call"
                name = item.get("name")
                if isinstance(name, str) and turn.tool is None:
                    turn.tool = name[:128]
                break
        turn.stop_reason = stop
        if turn.recording:
            turn.usage = usage_fields(answer.get("usage"))

    def scan_chunk(self, turn: TurnScan, chunk: bytes) -> None:
        if turn.answer_id is None and b'"id"' in chunk:
            found = _ID.search(chunk)
            if found is not None:
                turn.answer_id = found.group(1).decode()
        if b"function_call" in chunk or b"tool_call" in chunk or b"mcp_call" in chunk:
            call = _TOOL_CALL.search(chunk)
            if call is not None:
                turn.stop_reason = "function_call"
                if turn.tool is None:
                    turn.tool = call.group(1).decode(errors="replace")
        if b"response.incomplete" in chunk or b"response.completed" in chunk:
            turn.answered = True
        if turn.stop_reason != "function_call":
            if b"response.incomplete" in chunk:
                turn.stop_reason = "max_tokens"
            elif b"response.completed" in chunk:
                turn.stop_reason = "stop"
        if turn.recording and b'"usage"' in chunk:
            counts = _USAGE.findall(chunk)
            if counts:
                turn.usage = {k.decode().removesuffix("_tokens"): int(v) for k, v in counts}

    def stream_error(self, exc: UpstreamError) -> bytes:
        # The Responses API's ``error`` event: the official clients raise on it.
        message, code = stream_cut_reason(exc)
        body = msgspec.json.encode(
            {"type": "error", "code": code, "message": message, "param": None}
        )
        return b"event: error\ndata: " + body + b"\n\n"
