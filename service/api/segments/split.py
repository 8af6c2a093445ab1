"""Per-turn segment splitting: what the sidecar declares in ``kv_transfer_params.tenure``.

The engine's ``tenure-fs`` tier places each KV block by the segment its tokens fall in
(:mod:`tenure.service.wire.segments`). The sidecar builds those segments for every tracked chat
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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tenure.service.api.segments.facts import MARKER_TOKENS, carried_reasoning, reasoning_digest
from tenure.service.api.segments.state import MAX_SPANS, SegmentState, Span
from tenure.service.policy.segments import SegmentClass, SessionRole

__all__ = ["Split", "split_turn"]


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
