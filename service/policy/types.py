"""Value types shared by every policy, the host-tier bookkeeping and their callers.

A host tier holds *blocks*. Blocks belong to *segments*: a segment is one contiguous,
append-only run of a session's context (a session's main context, a sub-agent's context, the
tail that follows a compaction). Block ``i`` of a segment is the ``i``-th block of that run, so a
request's context is a short tuple of :class:`Run` values in prefix order. Policies reason about
runs and sessions, never about individual block keys, so their cost grows with sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

__all__ = [
    "EvictionClass",
    "Run",
    "SessionHint",
    "StoreResult",
    "Victim",
]


class Run(NamedTuple):
    """Blocks ``[start, stop)`` of segment ``seg`` (an interned segment id)."""

    seg: int
    start: int
    stop: int

    @property
    def blocks(self) -> int:
        return self.stop - self.start


class EvictionClass(StrEnum):
    """Why a block left the tier; the label used in counters and metrics."""

    FINISHED = "finished"  # its session declared its last turn (or ended)
    OVERDUE = "overdue"  # now > expected wake-up + slack
    FAR_WAKEUP = "far_wakeup"  # live, but its predicted wake-up is the farthest
    IDLE = "idle"  # tags-off: the longest-idle session goes first
    RECENCY = "recency"  # plain recency (LRU, ARC and friends)
    UTILITY = "utility"  # lowest utility score (Marconi)
    TTL = "ttl"  # a TTL pin expired or was force-evicted (Continuum)
    ORACLE = "oracle"  # clairvoyant: farthest true next use
    RECLAIM = "reclaim"  # freed at once on a declared last turn or an expired host TTL


class Victim(NamedTuple):
    """Blocks a policy chose to evict, with the reason.

    ``descending``: the blocks leave tail first (highest index first), as vLLM's LRU evicts a
    run a request re-ranked tail to head; callers that list them one by one keep that order.
    """

    run: Run
    cls: EvictionClass
    descending: bool = False


@dataclass(frozen=True, slots=True)
class SessionHint:
    """What the harness (or the sidecar on its behalf) says about a session after a turn.

    ``expected_gap_s`` is the predicted idle time before the session's next turn, ``None`` when
    unknown (tags-off). ``last_turn`` declares that the session has no next turn.
    ``suspended`` marks a human-approval wait (minutes to hours). Given at a request's start,
    ``expected_gap_s`` is the gap expected *after* that turn; a later hint refines it.
    """

    expected_gap_s: float | None = None
    last_turn: bool = False
    suspended: bool = False
    #: For a suspended session: discard its host copy this many seconds after the hint
    #: (``None`` = keep it as long as capacity allows).
    host_ttl_s: float | None = None
    parent: str | None = None
    #: The run probably ended with this turn (a one-shot entry point's final answer, a
    #: sub-agent's answer to its lead): its blocks go first among the resident, like a
    #: finished session's, but are not reclaimed, so a run resumed later still hits them.
    likely_end: bool = False


@dataclass(frozen=True, slots=True)
class StoreResult:
    """Outcome of offering blocks to the tier: all of them admitted, or none."""

    admitted: bool
    stored_blocks: int
    victims: tuple[Victim, ...] = ()
