"""``/v1/chat/completions``: the OpenAI Chat Completions API, the sidecar's first route.

What differs here from the other tracked APIs: a session no key names is inferred from the
``messages`` prefix (when the tenant allows inference); the stop reason is
``choices[0].finish_reason`` and the tool the first ``tool_calls`` entry's function, read from
the whole answer or from each streamed chunk; usage is ``prompt_tokens`` /
``completion_tokens``; errors and the event that ends a cut stream are the OpenAI API's (an
error event, then ``[DONE]``). The readers of an answer are shared with
:mod:`tenure.service.api.shapes.completions`, whose answers have the same ``choices``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec

from tenure.service.api.hints.inference import prefix_digests
from tenure.service.api.shapes.base import Prepared, TurnScan, openai_error_shape
from tenure.service.api.upstream.client import UpstreamError
from tenure.service.api.upstream.relay import stream_cut_reason

__all__ = ["ChatShape", "openai_stream_error", "scan_choices", "scan_choices_chunk"]

_encode = msgspec.json.Encoder().encode
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]+)"')
_TOOL_NAME = re.compile(rb'"function"\s*:\s*\{\s*"name"\s*:\s*"([^"\\]{1,128})"')
_USAGE = re.compile(rb'"(prompt|completion)_tokens"\s*:\s*([0-9]{1,12})')


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    message: dict[str, Any] | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice] = []
    usage: dict[str, Any] | None = None


_completion_decoder = msgspec.json.Decoder(_Completion)


def scan_choices(turn: TurnScan, content: bytes) -> None:
    """The stop reason, tool and usage of a whole (chat or text) completion."""
    try:
        completion = _completion_decoder.decode(content)
    except msgspec.DecodeError:
        return
    if not completion.choices:
        return
    if completion.usage is not None and turn.recording:
        turn.usage = {
            k.removesuffix("_tokens"): v
            for k, v in completion.usage.items()
            if k in ("prompt_tokens", "completion_tokens") and isinstance(v, int)
        }
    choice = completion.choices[0]
    turn.stop_reason = choice.finish_reason
    calls = (choice.message or {}).get("tool_calls")
    if isinstance(calls, list) and calls:
        function = calls[0].get("function") if isinstance(calls[0], dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            turn.tool = function["name"]


def scan_choices_chunk(turn: TurnScan, chunk: bytes) -> None:
    """The same, from one streamed chunk (byte searches first: most chunks hold none)."""
    if b"finish_reason" in chunk:
        for match in _FINISH.finditer(chunk):
            turn.stop_reason = match.group(1).decode()
            turn.answered = True
    if turn.tool is None and b'"function"' in chunk:
        found = _TOOL_NAME.search(chunk)
        if found is not None:
            turn.tool = found.group(1).decode(errors="replace")
    if turn.recording and b'"usage"' in chunk:
        turn.usage = {k.decode(): int(v) for k, v in _USAGE.findall(chunk)}


def openai_stream_error(exc: UpstreamError) -> bytes:
    """The SSE events that end a stream the upstream broke: an OpenAI-style error event (the
    official clients raise on it), then ``[DONE]``, so no client takes a cut answer for a
    whole one."""
    message, code = stream_cut_reason(exc)
    body = _encode({"error": {"message": message, "type": code, "param": None, "code": code}})
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"


class ChatShape:
    name = "chat"
    path = "/v1/chat/completions"
    tracks_segments = True
    chat_messages = True
    error = staticmethod(openai_error_shape)
    scan_body = staticmethod(scan_choices)
    scan_chunk = staticmethod(scan_choices_chunk)
    stream_error = staticmethod(openai_stream_error)

    def prepare(self, payload: dict[str, Any], headers: Mapping[str, str]) -> Prepared:
        messages = payload.get("messages")
        if not isinstance(messages, list):
            return Prepared()
        return Prepared(infer=lambda: prefix_digests(payload.get("model"), messages))
