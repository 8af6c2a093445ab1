"""Context segments and the live-segment table (Lachesis's segment table, harness-driven).

A session's context splits at harness boundaries into *segments*, each with one lifetime class:

* ``reasoning`` — the reasoning a response emitted; the harness strips it from the next
  message, so it dies at the session's next turn;
* ``output`` — carried (reasoning-stripped) output of the lead agent: lives as long as the
  session;
* ``lead`` — the lead agent's context (system prompt, tools, user and tool turns);
* ``worker`` — a sub-agent's context: lives from its spawn to its return;
* ``reviewer`` — a reviewing sub-agent: short-lived, read by nobody after it returns.

:class:`SegmentTable` keeps one row per live segment: class, owning session, parent, the
boundary that closes it, and its resident block counts per tier (charged by the caller, which
owns the blocks). Boundaries close segments: :meth:`SegmentTable.next_turn` closes the
session's reasoning, :meth:`SegmentTable.worker_return` closes a worker's (or reviewer's)
segments, :meth:`SegmentTable.end_session` closes everything the session and its live children
still hold. A closed segment is returned to the caller, who frees its blocks and discharges the
counts; :meth:`SegmentTable.leaked` lists closed segments still holding blocks.

Bad input raises a :class:`SegmentError` subclass and changes nothing: a spawn under an unknown
parent, a worker returning twice (or never spawned), a turn number going backwards, a lead
ending while its workers are live, a duplicate segment id. Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

__all__ = [
    "BoundaryOrderError",
    "DuplicateSegmentError",
    "Segment",
    "SegmentClass",
    "SegmentError",
    "SegmentTable",
    "SessionRole",
    "UnknownParentError",
    "UnknownSegmentError",
    "WorkerReturnedError",
]


class SegmentClass(StrEnum):
    REASONING = "reasoning"
    OUTPUT = "output"
    LEAD = "lead"
    WORKER = "worker"
    REVIEWER = "reviewer"


class SessionRole(StrEnum):
    """What a session is in its agent tree (the class its non-reasoning context takes)."""

    LEAD = "lead"
    WORKER = "worker"
    REVIEWER = "reviewer"


_ROLE_CLASS = {
    SessionRole.LEAD: SegmentClass.LEAD,
    SessionRole.WORKER: SegmentClass.WORKER,
    SessionRole.REVIEWER: SegmentClass.REVIEWER,
}


class SegmentError(ValueError):
    """A boundary or spawn the table cannot accept; nothing was changed."""


class UnknownParentError(SegmentError):
    pass


class WorkerReturnedError(SegmentError):
    pass


class BoundaryOrderError(SegmentError):
    pass


class DuplicateSegmentError(SegmentError):
    pass


class UnknownSegmentError(SegmentError):
    pass


@dataclass(slots=True)
class Segment:
    """One row of the live-segment table."""

    key: str  # session-scoped: "<session>#<segment id>"
    session: str
    cls: SegmentClass
    turn: int  # the session turn that opened it
    #: Predicted lifetime (seconds) for a worker, from the ranker at spawn; ``None`` otherwise.
    predicted_lifetime_s: float | None = None
    #: Resident blocks per tier name, charged and discharged by the caller.
    resident: Counter[str] = field(default_factory=Counter)
    closed: bool = False

    @property
    def blocks(self) -> int:
        return sum(self.resident.values())


@dataclass(slots=True)
class _Session:
    role: SessionRole
    parent: str | None
    turn: int = -1
    returned: bool = False
    ended: bool = False
    children: set[str] = field(default_factory=set)
    segments: dict[str, Segment] = field(default_factory=dict)  # segment id -> row


def segment_key(session: str, segment_id: str) -> str:
    return f"{session}#{segment_id}"


class SegmentTable:
    """Live segments of every session, opened and closed at harness boundaries.

    Sessions dropped by :meth:`forget_ended` leave a tombstone (the most recent
    ``tombstones`` ids), so a late request of a forgotten worker is still refused as a second
    return rather than taken for a new spawn.
    """

    def __init__(self, tombstones: int = 65536) -> None:
        self._sessions: dict[str, _Session] = {}
        self._tombstones: OrderedDict[str, SessionRole] = OrderedDict()
        self._max_tombstones = tombstones
        self._segments: dict[str, Segment] = {}
        self._closed: dict[str, Segment] = {}  # closed but still holding blocks

    # --- sessions -------------------------------------------------------------------------

    def open_lead(self, session: str) -> None:
        """A root (lead-agent) session starts; idempotent for a live lead."""
        known = self._sessions.get(session)
        if known is not None:
            if known.role is SessionRole.LEAD and not known.ended:
                return
            if known.ended:
                raise BoundaryOrderError(f"session {session!r} has already ended")
            raise SegmentError(f"session {session!r} already exists as a {known.role.value}")
        self._check_tombstone(session)
        self._sessions[session] = _Session(SessionRole.LEAD, None)

    def spawn(
        self,
        session: str,
        parent: str,
        role: SessionRole = SessionRole.WORKER,
        predicted_lifetime_s: float | None = None,
    ) -> Segment:
        """A sub-agent ``session`` is spawned by ``parent``; returns its context segment."""
        if role is SessionRole.LEAD:
            raise SegmentError("a spawned session is a worker or a reviewer, not a lead")
        owner = self._sessions.get(parent)
        if owner is None or owner.ended or owner.returned:
            raise UnknownParentError(f"spawn of {session!r} under unknown parent {parent!r}")
        if session in self._sessions:
            raise DuplicateSegmentError(f"session {session!r} was already spawned")
        self._check_tombstone(session)
        if predicted_lifetime_s is not None and not predicted_lifetime_s >= 0:
            raise SegmentError("predicted_lifetime_s must be a non-negative number")
        self._sessions[session] = _Session(role, parent)
        owner.children.add(session)
        return self.open(
            session, "context", _ROLE_CLASS[role], predicted_lifetime_s=predicted_lifetime_s
        )

    def role(self, session: str) -> SessionRole | None:
        s = self._sessions.get(session)
        return s.role if s is not None else self._tombstones.get(session)

    def parent(self, session: str) -> str | None:
        s = self._sessions.get(session)
        return None if s is None else s.parent

    def live_sessions(self) -> list[str]:
        return [k for k, s in self._sessions.items() if not s.ended]

    # --- segments -------------------------------------------------------------------------

    def open(
        self,
        session: str,
        segment_id: str,
        cls: SegmentClass,
        *,
        predicted_lifetime_s: float | None = None,
    ) -> Segment:
        """Open segment ``segment_id`` of a live ``session`` (at its current turn)."""
        s = self._live(session)
        if segment_id in s.segments:
            raise DuplicateSegmentError(f"segment {segment_id!r} of {session!r} is already open")
        if cls is SegmentClass.REASONING and s.turn < 0:
            raise BoundaryOrderError(f"reasoning of {session!r} before its first turn")
        seg = Segment(
            segment_key(session, segment_id),
            session,
            cls,
            max(s.turn, 0),
            predicted_lifetime_s,
        )
        s.segments[segment_id] = seg
        self._segments[seg.key] = seg
        return seg

    def get(self, session: str, segment_id: str) -> Segment | None:
        s = self._sessions.get(session)
        return None if s is None else s.segments.get(segment_id)

    def segment(self, key: str) -> Segment | None:
        """A live segment by key, or a closed one still holding blocks."""
        return self._segments.get(key) or self._closed.get(key)

    def live(self) -> Iterator[Segment]:
        return iter(self._segments.values())

    def workers(self) -> list[Segment]:
        """Live worker context segments, spawn order."""
        return [seg for seg in self._segments.values() if seg.cls is SegmentClass.WORKER]

    # --- boundaries -----------------------------------------------------------------------

    def next_turn(
        self, session: str, turn: int | None = None, keep: Iterable[str] = ()
    ) -> list[Segment]:
        """``session`` starts a new turn: its reasoning segments close (the harness strips them).

        Reasoning the new turn still carries (its segment ids in ``keep``: a tool loop that
        sends the reasoning back) stays open. ``turn`` (when given) must not go backwards; the
        same turn again is a retry and closes nothing new. Returns the closed segments.
        """
        s = self._live(session)
        nxt = s.turn + 1 if turn is None else turn
        if nxt < s.turn:
            raise BoundaryOrderError(
                f"turn {nxt} of {session!r} arrived after turn {s.turn} (out of order)"
            )
        if nxt == s.turn:
            return []
        s.turn = nxt
        carried = set(keep)
        return self._close(
            s,
            [
                sid
                for sid, seg in s.segments.items()
                if seg.cls is SegmentClass.REASONING and sid not in carried
            ],
        )

    def close(self, session: str, segment_id: str) -> list[Segment]:
        """Close one segment explicitly (e.g. a rewritten, dead context tail)."""
        s = self._live(session)
        if segment_id not in s.segments:
            raise UnknownSegmentError(f"segment {segment_id!r} of {session!r} is not open")
        return self._close(s, [segment_id])

    def worker_return(self, session: str) -> list[Segment]:
        """A worker (or reviewer) returned to its parent: every segment it holds closes."""
        s = self._sessions.get(session)
        if s is None:
            if session in self._tombstones:
                raise WorkerReturnedError(f"worker {session!r} returned twice")
            raise WorkerReturnedError(f"return of {session!r}, which was never spawned")
        if s.role is SessionRole.LEAD:
            raise BoundaryOrderError(f"{session!r} is a lead session; it ends, it does not return")
        if s.returned or s.ended:
            raise WorkerReturnedError(f"worker {session!r} returned twice")
        live_children = [c for c in s.children if not self._sessions[c].ended]
        if live_children:
            raise BoundaryOrderError(
                f"worker {session!r} returned while its own sub-agents "
                f"{sorted(live_children)} are live"
            )
        s.returned = True
        return self._finish(session, s)

    def end_session(self, session: str) -> list[Segment]:
        """A lead session ended (declared last turn, or abandoned): everything closes.

        Its live workers end with it (an abandoned tree leaks nothing). Ending an unknown or
        already-ended session is a no-op (ends are idempotent: a retried last turn is fine).
        """
        s = self._sessions.get(session)
        if s is None or s.ended:
            return []
        closed: list[Segment] = []
        for child in sorted(s.children):
            closed.extend(self.end_session(child))
        closed.extend(self._finish(session, s))
        return closed

    def forget_ended(self) -> int:
        """Drop ended sessions whose segments hold no blocks (long-running callers)."""
        gone = [
            k
            for k, s in self._sessions.items()
            if s.ended and not any(seg.session == k for seg in self._closed.values())
        ]
        for k in gone:
            parent = self._sessions[k].parent
            self._tombstones[k] = self._sessions.pop(k).role
            self._tombstones.move_to_end(k)
            while len(self._tombstones) > self._max_tombstones:
                self._tombstones.popitem(last=False)
            if parent is not None and parent in self._sessions:
                self._sessions[parent].children.discard(k)
        return len(gone)

    # --- block accounting ------------------------------------------------------------------

    def charge(self, key: str, tier: str, blocks: int) -> None:
        """The caller placed (``blocks > 0``) or freed (``< 0``) blocks of segment ``key``."""
        seg = self.segment(key)
        if seg is None:
            raise UnknownSegmentError(f"no segment {key!r}")
        left = seg.resident[tier] + blocks
        if left < 0:
            raise SegmentError(f"segment {key!r} would hold {left} blocks in {tier!r}")
        if left:
            seg.resident[tier] = left
        else:
            del seg.resident[tier]
        if seg.closed and not seg.resident:
            del self._closed[key]

    def resident_blocks(self, tier: str | None = None) -> int:
        """Blocks charged to every segment (live or closed), in ``tier`` or in all tiers."""
        rows: Iterable[Segment] = [*self._segments.values(), *self._closed.values()]
        if tier is None:
            return sum(seg.blocks for seg in rows)
        return sum(seg.resident[tier] for seg in rows)

    def resident_by_class(self, tier: str) -> Counter[SegmentClass]:
        out: Counter[SegmentClass] = Counter()
        for seg in [*self._segments.values(), *self._closed.values()]:
            if seg.resident[tier]:
                out[seg.cls] += seg.resident[tier]
        return out

    def leaked(self) -> list[Segment]:
        """Closed segments whose blocks the caller has not freed yet."""
        return list(self._closed.values())

    # --- internals ----------------------------------------------------------------------

    def _check_tombstone(self, session: str) -> None:
        role = self._tombstones.get(session)
        if role is SessionRole.LEAD:
            raise BoundaryOrderError(f"session {session!r} has already ended")
        if role is not None:
            raise WorkerReturnedError(f"worker {session!r} already returned")

    def _live(self, session: str) -> _Session:
        s = self._sessions.get(session)
        if s is None:
            if session in self._tombstones:
                raise BoundaryOrderError(f"session {session!r} has already ended")
            raise UnknownParentError(f"unknown session {session!r}")
        if s.ended:
            raise BoundaryOrderError(f"session {session!r} has already ended")
        return s

    def _close(self, s: _Session, ids: list[str]) -> list[Segment]:
        closed = []
        for sid in ids:
            seg = s.segments.pop(sid)
            del self._segments[seg.key]
            seg.closed = True
            if seg.resident:
                self._closed[seg.key] = seg
            closed.append(seg)
        return closed

    def _finish(self, session: str, s: _Session) -> list[Segment]:
        closed = self._close(s, list(s.segments))
        s.ended = True
        return closed
