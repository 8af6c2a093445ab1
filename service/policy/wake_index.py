"""An index of idle resident sessions by predicted wake-up, so the gate decides in O(log n).

The gate's questions on every store that needs room — which sessions are finished, which are
overdue (most overdue first), which wake later than the newcomer (farthest first) — would cost a
scan and a sort of every resident session. This index keeps the answers ordered as sessions go
idle, get hints, start a request or lose their blocks, so a decision visits only the sessions it
evicts (plus the ones it must skip).

Two kinds of idle sessions are kept apart:

* *timed* ones have a hinted wake-up; they sit in two sorted lists, by wake-up and by deadline
  (wake-up + slack), fixed when the session goes idle;
* *untimed* ones (no gap hint: tags-off) wake at ``last_activity + horizon`` with one horizon for
  all, so their order is their last-activity order: a third sorted list. (Not insertion order:
  a session is re-indexed with its old last activity when another session stores into it.)
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

__all__ = ["WakeIndex"]


class WakeIndex:
    def __init__(self) -> None:
        self._by_wakeup: list[tuple[float, str]] = []
        self._by_deadline: list[tuple[float, str]] = []
        self._timed: dict[str, tuple[float, float]] = {}  # session -> (wakeup, deadline)
        self._untimed: dict[str, float] = {}  # session -> last activity
        self._by_last: list[tuple[float, str]] = []
        self.finished: dict[str, None] = {}  # finished sessions still holding blocks

    def __contains__(self, session: str) -> bool:
        return session in self._timed or session in self._untimed or session in self.finished

    def __len__(self) -> int:
        return len(self._timed) + len(self._untimed) + len(self.finished)

    def discard(self, session: str) -> None:
        entry = self._timed.pop(session, None)
        if entry is not None:
            wakeup, deadline = entry
            _remove(self._by_wakeup, (wakeup, session))
            _remove(self._by_deadline, (deadline, session))
        last = self._untimed.pop(session, None)
        if last is not None:
            _remove(self._by_last, (last, session))
        self.finished.pop(session, None)

    def add_timed(self, session: str, wakeup: float, deadline: float) -> None:
        self.discard(session)
        self._timed[session] = (wakeup, deadline)
        insort(self._by_wakeup, (wakeup, session))
        insort(self._by_deadline, (deadline, session))

    def add_untimed(self, session: str, last_activity: float) -> None:
        self.discard(session)
        self._untimed[session] = last_activity
        insort(self._by_last, (last_activity, session))

    def add_finished(self, session: str) -> None:
        self.discard(session)
        self.finished[session] = None

    def overdue(
        self, now: float, untimed_deadline: Callable[[float], float], horizon: float
    ) -> list[tuple[float, str]]:
        """``(wake-up, session)`` of every overdue session, most overdue (earliest) first."""
        late = []
        for deadline, session in self._by_deadline:
            if deadline >= now:
                break
            late.append((self._timed[session][0], session))
        for last, session in self._by_last:
            if untimed_deadline(last) >= now:
                break
            late.append((last + horizon, session))
        late.sort()
        return late

    def far(self, after: float, horizon: float) -> Iterator[tuple[float, str]]:
        """``(wake-up, session)`` of idle sessions waking strictly after ``after``, farthest first.

        Overdue sessions never qualify: ``after`` is at least now, so they wake earlier.
        """
        timed = ((w, s) for w, s in reversed(self._by_wakeup))
        untimed = ((last + horizon, s) for last, s in reversed(self._by_last))
        for wakeup, session in heapq.merge(timed, untimed, reverse=True):
            if wakeup <= after or math.isnan(wakeup):
                return
            yield wakeup, session


def _remove(ordered: list[tuple[float, str]], item: tuple[float, str]) -> None:
    i = bisect_left(ordered, item)
    if i < len(ordered) and ordered[i] == item:
        del ordered[i]
