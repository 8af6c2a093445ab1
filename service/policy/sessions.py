"""Session-level bookkeeping shared by the policies that decide per session, not per block.

A :class:`SessionPolicy` tracks each session's lifecycle from the hooks (request start, request
finished, hints), reclaims a session's blocks at once when its declared last turn finishes,
discards a suspended session's host copy when its host TTL expires, and evicts whole victims
tail-first (a session's tail is worthless without its head, its head is a partial hit without
its tail). Subclasses only order the victims: :meth:`victim_order`.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tenure.service.policy.base import PolicyParams, TierPolicy
from tenure.service.policy.types import EvictionClass, Run, SessionHint, Victim

__all__ = ["SessionLife", "SessionPolicy"]

#: Idle gaps remembered for the hint-free horizon (the most recent ones).
_GAP_WINDOW = 512


@dataclass(slots=True)
class SessionLife:
    """What a policy knows about one session."""

    last_activity: float = 0.0
    active: bool = False  # a request is in flight: its blocks are about to be (re)used
    expected_gap_s: float | None = None  # the gap expected after the current/last turn
    wakeup: float | None = None  # absolute predicted next arrival (idle sessions)
    declared_last: bool = False
    finished: bool = False
    suspended: bool = False
    ttl_deadline: float | None = None
    refused: bool = False  # refused during the current request: keep refusing (no holes)
    likely_end: bool = False  # the run probably ended: finished (evicted first), not reclaimed


class SessionPolicy(TierPolicy):
    """Base for per-session policies: lifecycle book, reclaim, host TTL, tail-first victims."""

    #: Whether a declared last turn frees the session's blocks at once.
    reclaims: bool = False

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self.lives: dict[str, SessionLife] = {}
        self._reclaim: list[str] = []
        self._ttl_heap: list[tuple[float, str]] = []
        # Observed idle gaps (request finish -> next request start), for hint-free horizons:
        # the window in arrival order and the same values kept sorted (O(1) quantiles).
        self._gaps: deque[float] = deque()
        self._gaps_sorted: list[float] = []

    def peek(self, session: str) -> SessionLife:
        """The session's life, or a fresh default without recording it (queries change nothing)."""
        life = self.lives.get(session)
        return life if life is not None else SessionLife()

    def life(self, session: str) -> SessionLife:
        life = self.lives.get(session)
        if life is None:
            life = self.lives[session] = SessionLife()
        return life

    # --- hooks ------------------------------------------------------------------------------

    def on_request_start(self, session: str, now: float) -> None:
        life = self.life(session)
        if not life.active and life.last_activity > 0.0:
            self._observe_gap(max(0.0, now - life.last_activity))
        life.active = True
        life.refused = False
        life.last_activity = now
        life.wakeup = None
        life.suspended = False
        life.ttl_deadline = None
        life.finished = False
        life.likely_end = False  # it came back: the inferred end was wrong

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        life = self.life(session)
        life.active = False
        life.last_activity = now
        if life.expected_gap_s is not None:
            life.wakeup = now + life.expected_gap_s
        if life.declared_last:
            self._finish(session, life)
        elif life.likely_end:
            self._likely_end(life)

    def on_hint(self, session: str, hint: SessionHint, now: float) -> None:
        if self.hint_source == "none":
            return
        life = self.life(session)
        life.expected_gap_s = hint.expected_gap_s
        if not life.active:
            life.wakeup = None if hint.expected_gap_s is None else now + hint.expected_gap_s
        life.declared_last = hint.last_turn
        if hint.last_turn and not life.active:
            self._finish(session, life)
        life.likely_end = hint.likely_end and not hint.last_turn
        if life.likely_end and not life.active:
            self._likely_end(life)
        life.suspended = hint.suspended
        if hint.suspended and hint.host_ttl_s is not None:
            life.ttl_deadline = now + hint.host_ttl_s
            heapq.heappush(self._ttl_heap, (life.ttl_deadline, session))
        else:
            # The newest hint wins: a suspension without a timer (retained, or a re-priced
            # one whose rent stopped) cancels the one before.
            life.ttl_deadline = None

    def forget(self, session: str) -> None:
        self.lives.pop(session, None)
        if session in self._reclaim:
            self._reclaim.remove(session)

    def on_refused(self, session: str, runs: Sequence[Run], now: float) -> None:
        self.life(session).refused = True

    def _finish(self, session: str, life: SessionLife) -> None:
        life.finished = True
        life.declared_last = False
        life.wakeup = None
        if self.reclaims:
            self._reclaim.append(session)

    def _likely_end(self, life: SessionLife) -> None:
        """Finished for eviction order, without a reclaim: a resumed run hits what is left."""
        life.finished = True
        life.wakeup = None

    # --- timers -----------------------------------------------------------------------------

    def due(self, now: float) -> list[Victim]:
        victims: list[Victim] = []
        for session in self._reclaim:
            victims.extend(self._all_blocks(session, EvictionClass.RECLAIM))
        self._reclaim.clear()
        while self._ttl_heap and self._ttl_heap[0][0] <= now:
            deadline, session = heapq.heappop(self._ttl_heap)
            life = self.lives.get(session)
            if life is not None and life.ttl_deadline == deadline and life.suspended:
                life.ttl_deadline = None
                victims.extend(self._all_blocks(session, EvictionClass.TTL))
                self.counters["ttl_expiries"] += 1
        self._count_victims(victims)
        return victims

    def next_timer(self) -> float | None:
        if self._reclaim:
            return float("-inf")
        while self._ttl_heap:
            deadline, session = self._ttl_heap[0]
            life = self.lives.get(session)
            if life is not None and life.ttl_deadline == deadline and life.suspended:
                return deadline
            heapq.heappop(self._ttl_heap)
        return None

    # --- victims ----------------------------------------------------------------------------

    def _all_blocks(self, session: str, cls: EvictionClass) -> list[Victim]:
        tier = self.tier
        victims: list[Victim] = []
        for seg in tier.segments_of(session):
            victims.extend(Victim(r, cls) for r in tier.tail_runs(seg, tier.resident_blocks(seg)))
        return victims

    def excluded(self, incoming: str | None, protected: Sequence[Run]) -> set[str]:
        """Sessions that may not lose blocks now: the incoming one and those owning the offer."""
        excluded = {self.tier.owner(run.seg) for run in protected}
        if incoming is not None:
            excluded.add(incoming)
        return excluded

    def refused_already(self, incoming: str | None) -> bool:
        """The incoming request was refused once: one refusal per request, so a stored prefix
        never gets a hole."""
        if incoming is None:
            return False
        life = self.lives.get(incoming)
        return life is not None and life.refused

    def candidates(self, incoming: str | None, protected: Sequence[Run]) -> dict[str, int]:
        """Resident sessions that may lose blocks: not the incoming one, not owning the offer."""
        excluded = self.excluded(incoming, protected)
        return {s: n for s, n in self.tier.resident_sessions() if s not in excluded}

    def take(self, ordered: Iterable[tuple[str, EvictionClass]], need: int) -> list[Victim]:
        """Victims covering exactly ``need`` blocks from sessions in order, each tail-first."""
        tier = self.tier
        victims: list[Victim] = []
        for session, cls in ordered:
            for seg in reversed(tier.segments_of(session)):
                k = min(need, tier.resident_blocks(seg))
                if k <= 0:
                    continue
                victims.extend(Victim(run, cls) for run in tier.tail_runs(seg, k))
                need -= k
                if need == 0:
                    return victims
        raise AssertionError("take() was asked for more blocks than its candidates hold")

    def _observe_gap(self, gap: float) -> None:
        if len(self._gaps) == _GAP_WINDOW:
            oldest = self._gaps.popleft()
            del self._gaps_sorted[bisect_left(self._gaps_sorted, oldest)]
        self._gaps.append(gap)
        insort(self._gaps_sorted, gap)

    def idle_horizon(self, quantile: float, fallback_s: float) -> float:
        """The ``quantile`` of observed idle gaps: past it a silent session is probably gone."""
        ordered = self._gaps_sorted
        if len(ordered) < 5:
            return fallback_s
        return ordered[min(len(ordered) - 1, int(quantile * len(ordered)))]

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        if n == 0:
            return []
        order = self.victim_order(n, incoming, self.candidates(incoming, protected), now)
        if order is None:
            return None
        victims = self.take(order, n)
        self._count_victims(victims)
        return victims

    def victim_order(
        self, n: int, incoming: str | None, candidates: dict[str, int], now: float
    ) -> list[tuple[str, EvictionClass]] | None:
        """Sessions to take ``n`` blocks from, in order (holding >= n in all), or ``None``."""
        raise NotImplementedError


def enough(order: Sequence[tuple[str, EvictionClass]], candidates: dict[str, int], n: int) -> bool:
    return sum(candidates[s] for s, _ in order) >= n
