"""What a chat completion response tells about its tokens: usage counts and the reasoning it
carried (``message.reasoning`` / ``reasoning_content`` or inline ``<think>...</think>``), from a
whole body or chunk by chunk from an SSE stream. Pure: no I/O. The segment split
(:mod:`tenure.service.api.segments.split`) reads these facts to place the next request's boundaries.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

__all__ = [
    "MARKER_TOKENS",
    "ResponseFacts",
    "StreamFacts",
    "carried_reasoning",
    "reasoning_digest",
    "response_facts",
]

#: Think markers around a reasoning span that ``reasoning_tokens`` does not count.
MARKER_TOKENS = 2
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)


def reasoning_digest(text: str | None) -> str | None:
    """A short digest of reasoning text (whitespace-insensitive); None for none."""
    if not text or not text.strip():
        return None
    norm = " ".join(text.split())
    return hashlib.sha256(norm.encode("utf-8", "replace")).hexdigest()[:24]


def carried_reasoning(message: Any) -> str | None:
    """The reasoning an OpenAI chat assistant message carries back, if any."""
    if not isinstance(message, dict):
        return None
    for name in ("reasoning", "reasoning_content"):
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            return value
    content = message.get("content")
    if isinstance(content, str) and "<think>" in content:
        found = _THINK.search(content)
        if found is not None and found.group(1).strip():
            return found.group(1)
    return None


@dataclass(frozen=True, slots=True)
class ResponseFacts:
    """What one response said about its tokens."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    reasoning_tokens: int | None = None
    reasoning_digest: str | None = None
    reasoning_chars: int = 0
    content_chars: int = 0

    def reasoning_length(self) -> int:
        """Tokens the response's reasoning takes when sent back, think markers included
        (biased up: a block with any reasoning is reasoning anyway)."""
        total = self.completion_tokens or 0
        if self.reasoning_digest is None or total <= 0:
            return 0
        if self.content_chars == 0:
            return total + MARKER_TOKENS  # all of it, and the markers a harness wraps it in
        if self.reasoning_tokens:
            guess = self.reasoning_tokens + MARKER_TOKENS
        else:
            chars = self.reasoning_chars + self.content_chars
            guess = -(-total * self.reasoning_chars // max(1, chars)) + MARKER_TOKENS
        return max(1, min(total, guess))


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_tokens_details: dict[str, Any] | None = None


class _Choice(msgspec.Struct):
    message: dict[str, Any] | None = None
    delta: dict[str, Any] | None = None


class _Body(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None


_body = msgspec.json.Decoder(_Body)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _usage(usage: _Usage | None) -> tuple[int | None, int | None, int | None]:
    if usage is None:
        return None, None, None
    details = usage.completion_tokens_details or {}
    return (
        _int(usage.prompt_tokens),
        _int(usage.completion_tokens),
        _int(details.get("reasoning_tokens")),
    )


def response_facts(content: bytes) -> ResponseFacts | None:
    """The facts of a non-streamed chat completion body; None if it is not one."""
    try:
        body = _body.decode(content)
    except msgspec.DecodeError:
        return None
    message = body.choices[0].message if body.choices else None
    prompt, completion, reasoning = _usage(body.usage)
    text = carried_reasoning(message) or ""
    answer = (message or {}).get("content")
    answer_text = answer if isinstance(answer, str) else ""
    if text and "<think>" in answer_text:
        answer_text = _THINK.sub("", answer_text)
    return ResponseFacts(
        prompt, completion, reasoning, reasoning_digest(text), len(text), len(answer_text)
    )


@dataclass(slots=True)
class StreamFacts:
    """The same facts gathered from an SSE stream, chunk by chunk (usage only when the client
    asked for it with ``stream_options.include_usage``)."""

    _buffer: bytes = b""
    _reasoning: list[str] = field(default_factory=list)
    _content_chars: int = 0
    _usage: _Usage | None = None
    _limit: int = 1 << 20

    def feed(self, chunk: bytes) -> None:
        data = self._buffer + chunk
        lines = data.split(b"\n")
        self._buffer = lines.pop()[-self._limit :]
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if not payload or payload == b"[DONE]":
                continue
            try:
                body = _body.decode(payload)
            except msgspec.DecodeError:
                continue
            if body.usage is not None:
                self._usage = body.usage
            for choice in body.choices[:1]:
                delta = choice.delta or {}
                for name in ("reasoning", "reasoning_content"):
                    piece = delta.get(name)
                    if isinstance(piece, str) and sum(map(len, self._reasoning)) < self._limit:
                        self._reasoning.append(piece)
                piece = delta.get("content")
                if isinstance(piece, str):
                    self._content_chars += len(piece)

    def facts(self) -> ResponseFacts:
        text = "".join(self._reasoning)
        prompt, completion, reasoning = _usage(self._usage)
        return ResponseFacts(
            prompt, completion, reasoning, reasoning_digest(text), len(text), self._content_chars
        )
