"""The state layer's value types: what the store takes and gives back besides the record.

:class:`SessionUpdate` is a change to one session with the decision it publishes;
:class:`TurnStart` is the hot path's answer (or :class:`Uncounted` when Redis did not answer);
:class:`GapObservation` an idle gap that just ended; :class:`StoreLimits` the retention bounds.
The session hash itself is :class:`~tenure.service.wire.session_record.SessionRecord`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tenure.service.wire.push import Decision

__all__ = [
    "GapObservation",
    "SessionExists",
    "SessionNotFound",
    "SessionUpdate",
    "StoreLimits",
    "TurnStart",
    "Uncounted",
    "parse_observation",
    "text",
]


class SessionNotFound(LookupError):
    pass


class SessionExists(LookupError):
    pass


@dataclass(frozen=True, slots=True)
class StoreLimits:
    session_ttl_s: int = 7 * 24 * 3600
    finished_ttl_s: int = 3600
    decision_stream_maxlen: int = 10_000
    list_maxlen: int = 2048
    wait_samples_maxlen: int = 4096


@dataclass(frozen=True, slots=True)
class TurnStart:
    session: str
    turn: int
    previous_state: str
    #: The idle gap this request ended, when the session was idle.
    observation: GapObservation | None
    seq: int
    inferred: bool


@dataclass(frozen=True, slots=True)
class Uncounted:
    """A turn Redis did not count (it was unavailable): forwarded untracked, fail open."""

    session: str


@dataclass(frozen=True, slots=True)
class GapObservation:
    stop_reason: str
    tool: str
    gap_s: float
    #: What was predicted (or declared) for this gap, when known.
    expected_s: float | None


@dataclass(slots=True)
class SessionUpdate:
    """A change to one session record, with the decision it publishes.

    ``live_score=None`` removes the session from the live index (finished), unless
    ``keep_live`` leaves its position as it is; ``push`` names a
    bounded list (``"waits"`` / ``"suspensions"``) and the value to push to it.
    """

    fields: dict[str, str] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    live_score: float | None = None
    keep_live: bool = False
    ttl_s: int | None = None
    decision: Decision | None = None
    push: tuple[str, str] | None = None


def parse_observation(entry: bytes | str) -> GapObservation | None:
    """``stop_reason|tool|gap_s|expected_s`` -> observation; ``None`` if malformed."""
    reason, tool, gap, expected = [*text(entry).split("|"), "", "", "", ""][:4]
    try:
        return GapObservation(reason, tool, float(gap), float(expected) if expected else None)
    except ValueError:
        return None  # a malformed entry (a foreign writer) is skipped, never fatal


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
