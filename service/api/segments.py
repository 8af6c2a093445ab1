"""Per-turn segment splitting: what the sidecar declares in ``kv_transfer_params.tenure``.

The engine's ``tenure-fs`` tier places each KV block by the segment its tokens fall in
(:mod:`service.wire.segments`). The sidecar builds those segments for every tracked chat
turn from what it proxies, with no tokenizer of its own:

* **Prompt boundaries come from the engine's own counts.** A turn's response is generated after
  its prompt, so the previous response starts at token ``P`` = that turn's
  ``usage.prompt_tokens`` (or the ``/tokenize`` count the sidecar took before forwarding it).
  Chat templates that append history (the usual case) render the earlier turns to the same
  tokens, so ``P`` is exact in the next request too.
* **Reasoning vs carried output is decided by comparing the next request with the previous
  response**: the response carried reasoning (``message.reasoning`` / ``reasoning_content``,
  or inline ``<think>...</think>``) and the assistant message the next request sends back for
  it either carries the same reasoning (a tool loop: the reasoning segment stays open and keeps
  its id) or does not (the harness stripped it: the reasoning segment is not declared any more,
  and the engine closes it at the new turn, deleting whatever of it reached the SSD). What
  follows ``P`` in the next request is carried output plus the new messages: one segment of
  the carried class (``output`` for a lead, the role's class for a worker or reviewer; both
  route the same way, so the split between them is not needed).
* **The reasoning/output split inside a carried response** is ``usage.completion_tokens_details
  .reasoning_tokens`` plus 2 tokens for the think markers (exact but for the markers), else
  the completion tokens shared out by the characters of reasoning and content (an estimate,
  within a block or so): both biased toward reasoning, because a block holding any reasoning
  takes the reasoning class anyway (the wire's straddle rule).
* **A response's own reasoning is declared before it is generated**: a segment of class
  ``reasoning`` starting at the new prompt's length, when reasoning is expected (a hint, or an
  earlier response of the session or of the model carried some). That needs the prompt's length
  before forwarding: the engine's ``/tokenize`` (exact: the same renderer and template), else
  a lower bound from the previous turn (the end of the carried output: the new messages then
  count as reasoning and stay off the SSD, the safe side for wear).

Segment ids are the sidecar's own (``ctx``, ``t<turn>.r``, ``t<turn>.out``): never client text.
Adjacent segments of one class are merged, and past :data:`MAX_SPANS` the oldest carried
reasoning is folded into the carried class, so a request never declares more than the wire
allows. Pure: no I/O; :func:`split_turn` is reusable for other dialects (pass ``carried=``, an
extractor of the reasoning an assistant message carries back).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from service.policy.segments import SegmentClass, SessionRole
from service.wire.segments import MAX_SEGMENTS

__all__ = [
    "MAX_SPANS",
    "ResponseFacts",
    "SegmentState",
    "Span",
    "Split",
    "StreamFacts",
    "carried_reasoning",
    "reasoning_digest",
    "response_facts",
    "split_turn",
]

#: Prompt-side spans kept per session (the generation's own segment is one more).
MAX_SPANS = MAX_SEGMENTS - 1
#: Think markers around a reasoning span that ``reasoning_tokens`` does not count.
MARKER_TOKENS = 2
_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL)
_MODEL_MAX = 256


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


# --- what a response tells ----------------------------------------------------------------


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


# --- what the sidecar keeps per session ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Span:
    """One prompt-side segment: id, class, first token; a carried reasoning span also records
    which message carries it and the digest that message must keep carrying."""

    id: str
    cls: SegmentClass
    start: int
    message: int = -1
    digest: str = ""


class _StateWire(msgspec.Struct, forbid_unknown_fields=False):
    v: int = 1
    role: str = "lead"
    parent: str | None = None
    predicted_lifetime_s: float | None = None
    expected_tokens: int | None = None
    model: str = ""
    returned: bool = False
    reasons: bool = False
    turn: int = 0
    messages: int = 0
    gen_id: str | None = None
    gen_start: int | None = None
    spans: list[tuple[str, str, int, int, str]] = []
    facts: tuple[int | None, int | None, int | None, str | None, int, int] | None = None


_state_decoder = msgspec.json.Decoder(_StateWire)
_encode = msgspec.json.Encoder().encode


class StateDecodeError(ValueError):
    pass


@dataclass(slots=True)
class SegmentState:
    """A session's segment bookkeeping between turns (JSON in Redis, a few hundred bytes)."""

    role: SessionRole = SessionRole.LEAD
    parent: str | None = None
    predicted_lifetime_s: float | None = None
    expected_tokens: int | None = None
    model: str = ""
    returned: bool = False
    #: A response of this session carried reasoning: expect it again.
    reasons: bool = False
    #: The latest request with a recorded response: its turn, message count, generation
    #: segment (id and first token = its prompt length), spans and response facts.
    turn: int = 0
    messages: int = 0
    gen_id: str | None = None
    gen_start: int | None = None
    spans: list[Span] = field(default_factory=list)
    facts: ResponseFacts | None = None

    @property
    def role_class(self) -> SegmentClass:
        return SegmentClass(self.role.value)

    def to_json(self) -> bytes:
        f = self.facts
        wire = _StateWire(
            role=self.role.value,
            parent=self.parent,
            predicted_lifetime_s=self.predicted_lifetime_s,
            expected_tokens=self.expected_tokens,
            model=self.model[:_MODEL_MAX],
            returned=self.returned,
            reasons=self.reasons,
            turn=self.turn,
            messages=self.messages,
            gen_id=self.gen_id,
            gen_start=self.gen_start,
            spans=[(s.id, s.cls.value, s.start, s.message, s.digest) for s in self.spans],
            facts=None
            if f is None
            else (
                f.prompt_tokens,
                f.completion_tokens,
                f.reasoning_tokens,
                f.reasoning_digest,
                f.reasoning_chars,
                f.content_chars,
            ),
        )
        return _encode(wire)

    @classmethod
    def from_json(cls, raw: bytes | str) -> SegmentState:
        try:
            w = _state_decoder.decode(raw)
            spans = [Span(i, SegmentClass(c), s, m, d) for i, c, s, m, d in w.spans[:MAX_SPANS]]
            role = SessionRole(w.role)
        except (msgspec.DecodeError, ValueError) as exc:
            raise StateDecodeError(str(exc)) from None
        return cls(
            role=role,
            parent=w.parent,
            predicted_lifetime_s=w.predicted_lifetime_s,
            expected_tokens=w.expected_tokens,
            model=w.model,
            returned=w.returned,
            reasons=w.reasons,
            turn=w.turn,
            messages=w.messages,
            gen_id=w.gen_id,
            gen_start=w.gen_start,
            spans=spans,
            facts=None if w.facts is None else ResponseFacts(*w.facts),
        )


# --- the split ----------------------------------------------------------------------------

#: How the previous response was found in this request.
FIRST, CARRIED, STRIPPED, PLAIN, REWRITTEN, UNKNOWN = (
    "first",  # no earlier turn recorded
    "carried",  # its reasoning came back: the reasoning segment stays open
    "stripped",  # its reasoning did not come back: the segment closes at this turn
    "plain",  # it had no reasoning
    "rewritten",  # the message list does not extend the previous one: start over
    "unknown",  # the previous turn's boundaries are not known (no usage): nothing new declared
)


@dataclass(frozen=True, slots=True)
class Split:
    """This request's segments (prompt side, then the generation's) and how they were found."""

    spans: tuple[Span, ...]
    gen: Span | None
    verdict: str
    #: Whether the generation's start is exact (the prompt was counted) or a lower bound.
    exact_start: bool = True

    def wire(self) -> list[dict[str, Any]]:
        segs = [*self.spans, *(() if self.gen is None else (self.gen,))]
        return [{"id": s.id, "class": s.cls.value, "start": s.start} for s in segs]


Carried = Callable[[Any], "str | None"]


def split_turn(
    state: SegmentState,
    messages: Sequence[Any] | None,
    turn: int,
    *,
    reasoning_expected: bool,
    prompt_tokens: int | None,
    carried: Carried = carried_reasoning,
) -> Split:
    """The segments of request ``turn`` of a session with bookkeeping ``state``."""
    carried_cls = SegmentClass.OUTPUT if state.role is SessionRole.LEAD else state.role_class
    spans = list(state.spans) or [Span("ctx", state.role_class, 0)]
    verdict = FIRST
    msgs = list(messages) if messages is not None else None
    known = state.gen_start if state.gen_start is not None else None
    if known is None and state.facts is not None:
        known = state.facts.prompt_tokens
    if state.messages and msgs is not None:
        if len(msgs) <= state.messages or not _is_assistant(msgs[state.messages]):
            spans, verdict = [Span("ctx", state.role_class, 0)], REWRITTEN
        else:
            spans = _still_carried(spans, msgs, carried, carried_cls)
            if known is None or state.facts is None:
                verdict = UNKNOWN
            else:
                verdict = _previous_response(
                    spans, state, msgs[state.messages], known, carried, carried_cls
                )
    if prompt_tokens is not None:
        # A boundary estimated past the end of this prompt marks nothing in it.
        spans = [s for s in spans if s.start < prompt_tokens] or spans[:1]
    spans = _compact(spans, carried_cls)
    floor = spans[-1].start
    gen: Span | None = None
    exact = prompt_tokens is not None
    if reasoning_expected:
        start = prompt_tokens
        if start is None and verdict in (CARRIED, STRIPPED, PLAIN) and state.facts is not None:
            assert known is not None
            # The end of what the previous turn put in the prompt: a lower bound of this
            # prompt's length (the new messages then stay off the SSD).
            tail = state.facts.completion_tokens or 0
            if verdict == STRIPPED:
                tail -= state.facts.reasoning_length()
            start = known + max(0, tail - MARKER_TOKENS)
        if start is not None and start > floor:
            gen = Span(f"t{turn}.r", SegmentClass.REASONING, start)
    return Split(tuple(spans), gen, verdict, exact)


def _is_assistant(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") == "assistant"


def _still_carried(
    spans: list[Span], msgs: list[Any], carried: Carried, carried_cls: SegmentClass
) -> list[Span]:
    """Carried reasoning spans whose message no longer carries them: the prompt changed from
    there on (positions shift), so what follows is one carried span."""
    for i, span in enumerate(spans):
        if span.cls is not SegmentClass.REASONING or span.message < 0:
            continue
        message = msgs[span.message] if span.message < len(msgs) else None
        if reasoning_digest(carried(message)) != span.digest:
            return [*spans[:i], Span(span.id.replace(".r", ".out"), carried_cls, span.start)]
    return spans


def _previous_response(
    spans: list[Span],
    state: SegmentState,
    message: Any,
    start: int,
    carried: Carried,
    carried_cls: SegmentClass,
) -> str:
    facts = state.facts
    assert facts is not None
    if spans and spans[-1].start >= start:
        del spans[next(i for i, s in enumerate(spans) if s.start >= start) :]
        if not spans:
            spans.append(Span("ctx", state.role_class, 0))
    had = facts.reasoning_digest is not None
    out = Span(f"t{state.turn}.out", carried_cls, start)
    if not had:
        spans.append(out)
        return PLAIN
    if reasoning_digest(carried(message)) != facts.reasoning_digest:
        spans.append(out)
        return STRIPPED
    rid = state.gen_id or f"t{state.turn}.r"
    digest = facts.reasoning_digest or ""
    spans.append(Span(rid, SegmentClass.REASONING, start, state.messages, digest))
    # What follows the reasoning (its answer, then the new messages) is carried.
    spans.append(Span(out.id, carried_cls, start + facts.reasoning_length()))
    return CARRIED


def _compact(spans: list[Span], carried_cls: SegmentClass) -> list[Span]:
    """Merge neighbours of one class; past MAX_SPANS fold the oldest carried reasoning in."""
    while True:
        merged: list[Span] = []
        for span in spans:
            if merged and merged[-1].cls is span.cls and span.cls is not SegmentClass.REASONING:
                continue
            merged.append(span)
        if len(merged) <= MAX_SPANS:
            return merged
        oldest = next((i for i, s in enumerate(merged) if s.cls is SegmentClass.REASONING), None)
        if oldest is None:  # cannot happen after merging (one class alternates), but bounded
            return merged[:MAX_SPANS]
        s = merged[oldest]
        merged[oldest] = Span(s.id, carried_cls, s.start)
        spans = merged
