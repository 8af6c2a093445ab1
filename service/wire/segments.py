"""The segment wire format: what a request tells the engine about its context's segments.

The sidecar (or a harness talking to vLLM directly) puts it beside the lifecycle tags in
``kv_transfer_params["tenure"]``::

    {"session_id": "s1", "turn": 3,
     "role": "lead",                       # lead | worker | reviewer (default lead)
     "parent_session": "s0",               # worker / reviewer: the spawning session
     "predicted_lifetime_s": 95.0,         # worker: the ranker's prediction at spawn
     "expected_tokens": 12000,             # worker: its expected context size (fast budget)
     "segments": [                         # token ranges of this request's sequence
         {"id": "ctx", "class": "lead", "start": 0},
         {"id": "t2.reasoning", "class": "reasoning", "start": 1180},
         {"id": "t2.out", "class": "output", "start": 1436}],
     "close": ["t1.reasoning"],            # segments of this session whose boundary closed
     "last_turn": false}

Segment ``i`` covers tokens ``[start_i, start_{i+1})``; the last one runs to the end of the
sequence, generated tokens included (so a response's reasoning can be declared before it is
generated). ``start`` values begin at 0 and strictly increase. A block straddling a boundary
takes the shortest-lived class it overlaps (reasoning before reviewer before worker before
carried output before lead): a block holding any reasoning dies with it. Ids are session-scoped.

Besides the explicit ``close`` list, boundaries close implicitly: a request with a higher
``turn`` closes the session's reasoning segments (the harness strips them), and a declared
``last_turn`` ends the session (a worker's last turn is its return). :func:`parse_segment_tags`
is strict and raises :class:`SegmentWireError` naming the field (the sidecar answers 400 with
it; the engine adapter counts it and serves the request without segments).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tenure.service.policy.segments import SegmentClass, SessionRole

__all__ = [
    "MAX_SEGMENTS",
    "SegmentSpan",
    "SegmentTags",
    "SegmentWireError",
    "parse_segment_tags",
]

MAX_SEGMENTS = 64
_ID = re.compile(r"^[A-Za-z0-9._:/-]{1,64}$")
#: Shortest-lived first: the class a straddling block takes.
_SHORTEST_FIRST = (
    SegmentClass.REASONING,
    SegmentClass.REVIEWER,
    SegmentClass.WORKER,
    SegmentClass.OUTPUT,
    SegmentClass.LEAD,
)
_RANK = {cls: i for i, cls in enumerate(_SHORTEST_FIRST)}


class SegmentWireError(ValueError):
    """A malformed ``segments`` / ``close`` / ``role`` field; the message names it."""


@dataclass(frozen=True, slots=True)
class SegmentSpan:
    id: str
    cls: SegmentClass
    start: int


@dataclass(frozen=True, slots=True)
class SegmentTags:
    role: SessionRole = SessionRole.LEAD
    parent_session: str | None = None
    predicted_lifetime_s: float | None = None
    expected_tokens: int | None = None
    segments: tuple[SegmentSpan, ...] = ()
    close: tuple[str, ...] = ()

    def span_at(self, lo: int, hi: int) -> SegmentSpan | None:
        """The segment a block of tokens ``[lo, hi)`` belongs to (shortest-lived overlap)."""
        best: SegmentSpan | None = None
        segs = self.segments
        for i, seg in enumerate(segs):
            end = segs[i + 1].start if i + 1 < len(segs) else math.inf
            if seg.start < hi and end > lo and (best is None or _RANK[seg.cls] < _RANK[best.cls]):
                best = seg
        return best

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role.value}
        if self.parent_session is not None:
            out["parent_session"] = self.parent_session
        if self.predicted_lifetime_s is not None:
            out["predicted_lifetime_s"] = self.predicted_lifetime_s
        if self.expected_tokens is not None:
            out["expected_tokens"] = self.expected_tokens
        if self.segments:
            out["segments"] = [
                {"id": s.id, "class": s.cls.value, "start": s.start} for s in self.segments
            ]
        if self.close:
            out["close"] = list(self.close)
        return out


def _segment_id(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise SegmentWireError(f"{where}: must be 1-64 characters of [A-Za-z0-9._:/-]")
    return value


def _segments(raw: Any) -> tuple[SegmentSpan, ...]:
    if not isinstance(raw, list):
        raise SegmentWireError("segments: must be a list of {id, class, start}")
    if len(raw) > MAX_SEGMENTS:
        raise SegmentWireError(f"segments: at most {MAX_SEGMENTS} per request")
    out: list[SegmentSpan] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"segments[{i}]"
        if not isinstance(item, Mapping):
            raise SegmentWireError(f"{where}: must be an object")
        unknown = set(item) - {"id", "class", "start"}
        if unknown:
            raise SegmentWireError(f"{where}: unknown field(s) {sorted(unknown)}")
        seg_id = _segment_id(item.get("id"), f"{where}.id")
        if seg_id in seen:
            raise SegmentWireError(f"{where}.id: {seg_id!r} appears twice")
        seen.add(seg_id)
        try:
            cls = SegmentClass(str(item.get("class")))
        except ValueError:
            valid = ", ".join(c.value for c in SegmentClass)
            raise SegmentWireError(f"{where}.class: must be one of {valid}") from None
        start = item.get("start")
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise SegmentWireError(f"{where}.start: must be a non-negative integer")
        if not out and start != 0:
            raise SegmentWireError(f"{where}.start: the first segment must start at token 0")
        if out and start <= out[-1].start:
            raise SegmentWireError(f"{where}.start: starts must strictly increase")
        out.append(SegmentSpan(seg_id, cls, start))
    return tuple(out)


def parse_segment_tags(raw: Mapping[str, Any]) -> SegmentTags:
    """The segment fields of a ``kv_transfer_params["tenure"]`` object (strict)."""
    role = SessionRole.LEAD
    if "role" in raw:
        try:
            role = SessionRole(raw["role"])
        except ValueError:
            raise SegmentWireError("role: must be lead, worker or reviewer") from None
    parent = raw.get("parent_session")
    if parent is not None and (not isinstance(parent, str) or not 0 < len(parent) <= 256):
        raise SegmentWireError("parent_session: must be a session id")
    if role is not SessionRole.LEAD and parent is None:
        raise SegmentWireError(f"parent_session: required for a {role.value}")
    if role is SessionRole.LEAD and parent is not None:
        raise SegmentWireError("parent_session: a lead session has no parent")
    predicted = raw.get("predicted_lifetime_s")
    if predicted is not None:
        if (
            not isinstance(predicted, int | float)
            or isinstance(predicted, bool)
            or not math.isfinite(predicted)
            or predicted < 0
        ):
            raise SegmentWireError("predicted_lifetime_s: must be a non-negative number")
        predicted = float(predicted)
    expected = raw.get("expected_tokens")
    if expected is not None and (
        not isinstance(expected, int) or isinstance(expected, bool) or expected < 0
    ):
        raise SegmentWireError("expected_tokens: must be a non-negative integer")
    segments = _segments(raw["segments"]) if "segments" in raw else ()
    close: Sequence[Any] = raw.get("close", ())
    if not isinstance(close, list | tuple) or len(close) > MAX_SEGMENTS:
        raise SegmentWireError(f"close: must be a list of at most {MAX_SEGMENTS} segment ids")
    closed = tuple(_segment_id(c, f"close[{i}]") for i, c in enumerate(close))
    return SegmentTags(role, parent, predicted, expected, segments, closed)
