"""A session's segment bookkeeping between turns: its spans and the facts of its latest
response, with the compact JSON codec the sidecar keeps in Redis
(:mod:`tenure.service.state.segment_store`). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from tenure.service.api.segments.facts import ResponseFacts
from tenure.service.policy.segments import SegmentClass, SessionRole
from tenure.service.policy.spawn_context import ParentCall
from tenure.service.wire.segments import MAX_SEGMENTS

__all__ = ["MAX_SPANS", "SegmentState", "Span", "StateDecodeError"]

#: Prompt-side spans kept per session (the generation's own segment is one more).
MAX_SPANS = MAX_SEGMENTS - 1
_MODEL_MAX = 256


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
    human: bool = False
    gap_s: float = 0.0
    ended_at: float | None = None
    spawned_at: float | None = None


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
    #: That request answered a human message (not only tool results), the gap before it
    #: (the previous answer's end to its arrival) and when its answer ended (sidecar clock).
    human: bool = False
    gap_s: float = 0.0
    ended_at: float | None = None
    #: A worker: when it was spawned (its lifetime, counted in its parent's history on return).
    spawned_at: float | None = None

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
            human=self.human,
            gap_s=self.gap_s,
            ended_at=self.ended_at,
            spawned_at=self.spawned_at,
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
            human=w.human,
            gap_s=w.gap_s,
            ended_at=w.ended_at,
            spawned_at=w.spawned_at,
        )

    def parent_call(self) -> ParentCall | None:
        """This session's latest answered call, as a spawn under it sees it (None: no call
        answered yet)."""
        if self.turn <= 0:
            return None
        f = self.facts or ResponseFacts()
        return ParentCall(
            index=self.turn - 1,  # session turns count from 1, call indices from 0
            prompt_tokens=f.prompt_tokens or 0,
            output_tokens=f.completion_tokens or 0,
            thinking=f.reasoning_digest is not None or (f.reasoning_tokens or 0) > 0,
            human_turn=self.human,
            gap_s=self.gap_s,
        )
