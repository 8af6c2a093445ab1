"""Bounded samples of approval waits (suspend -> resume) for the retention controller.

:class:`WaitWindow` keeps the most recent observed waits (rather than a uniform reservoir over
all time, so the sample follows a change of the wait distribution). Observed at resume, they
are biased short right after a change; :class:`SuspensionCohort` corrects that by keeping the
recent suspensions that have not resumed yet as censored observations.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["SuspensionCohort", "WaitWindow"]


class WaitWindow:
    """The last ``capacity`` observed waits, in seconds."""

    def __init__(self, capacity: int = 2000, waits_s: Iterable[float] = ()) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = capacity
        self._waits: deque[float] = deque(maxlen=capacity)
        self.observed = 0
        for wait in waits_s:
            self.observe(wait)

    def observe(self, wait_s: float) -> bool:
        """Keep one wait; a negative or non-finite one is ignored (``False``)."""
        if not (math.isfinite(wait_s) and wait_s >= 0):
            return False
        self._waits.append(float(wait_s))
        self.observed += 1
        return True

    def __len__(self) -> int:
        return len(self._waits)

    def samples(self) -> list[float]:
        return list(self._waits)

    def to_state(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "waits_s": list(self._waits), "observed": self.observed}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> WaitWindow:
        window = cls(int(state.get("capacity", 2000)), state.get("waits_s", ()))
        window.observed = int(state.get("observed", len(window)))
        return window


class SuspensionCohort:
    """The last ``capacity`` suspensions, each resumed (wait known) or still pending.

    Waits observed only at resume are biased short (long waits have not come back yet): right
    after start-up or a change of the wait distribution, a sample of resumes alone says the
    host tier is cheap to keep. The cohort keeps the pending contexts as right-censored
    observations (``wait > age``); :meth:`sample` draws each from the cohort's Kaplan-Meier
    curve beyond its age (a seeded generator: deterministic), and past the curve's end from
    longer observed waits, or as a memoryless residual at the reference wait scale (the one
    assumption about a tail nobody has seen yet).
    """

    def __init__(self, capacity: int = 2000) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = capacity
        self._at: list[float] = []  # suspension times, ascending
        self._wait: list[float | None] = []
        self._lo = 0

    def suspend(self, now: float) -> None:
        if self._at and now < self._at[-1]:
            i = bisect.bisect_right(self._at, now, lo=self._lo)
            self._at.insert(i, now)
            self._wait.insert(i, None)
        else:
            self._at.append(now)
            self._wait.append(None)
        if len(self._at) - self._lo > self.capacity:
            self._lo += 1
            if self._lo > 1024 and self._lo * 2 > len(self._at):
                del self._at[: self._lo]
                del self._wait[: self._lo]
                self._lo = 0

    def resume(self, now: float, wait_s: float) -> bool:
        """Mark the pending suspension at ``now - wait_s`` resumed; ``False`` if not held."""
        at = now - wait_s
        tol = 1e-6 * max(1.0, abs(at))
        i = bisect.bisect_left(self._at, at - tol, lo=self._lo)
        while i < len(self._at) and self._at[i] <= at + tol:
            if self._wait[i] is None:
                self._wait[i] = wait_s
                return True
            i += 1
        return False

    def __len__(self) -> int:
        return len(self._at) - self._lo

    def pending(self) -> int:
        return sum(1 for w in self._wait[self._lo :] if w is None)

    def sample(
        self, now: float, observed_s: Sequence[float], tail_mean_s: float, seed: int = 0
    ) -> list[float]:
        """Every cohort member's wait: known, or drawn given ``wait > age``.

        A pending member's wait is drawn from the cohort's Kaplan-Meier survival curve beyond
        its age; where that curve ends (past the longest wait the cohort has seen come back),
        from ``observed_s`` longer than that, else as that point plus ``tail_mean_s``.
        """
        ats = self._at[self._lo :]
        waits = self._wait[self._lo :]
        # (time, resumed) in time order; at ties resumes come first, as Kaplan-Meier wants.
        points = sorted(
            ((w, True) if w is not None else (max(0.0, now - at), False))
            for at, w in zip(ats, waits, strict=True)
        )
        points.sort(key=lambda p: (p[0], not p[1]))
        times: list[float] = []
        survival: list[float] = []
        at_risk = len(points)
        alive = 1.0
        for time, resumed in points:
            if resumed:
                alive *= 1.0 - 1.0 / at_risk
                times.append(time)
                survival.append(alive)
            at_risk -= 1
        longer = sorted(w for w in observed_s if math.isfinite(w) and w >= 0)
        rng = random.Random(seed)
        out: list[float] = []
        for at, wait in zip(ats, waits, strict=True):
            if wait is not None:
                out.append(wait)
                continue
            age = max(0.0, now - at)
            k = bisect.bisect_right(times, age)
            s_age = survival[k - 1] if k > 0 else 1.0
            target = rng.random() * s_age
            # survival is non-increasing: the first event time at or below the target level.
            lo, hi = k, len(times)
            while lo < hi:
                mid = (lo + hi) // 2
                if survival[mid] <= target:
                    hi = mid
                else:
                    lo = mid + 1
            if lo < len(times):
                out.append(times[lo])
                continue
            edge = max(age, times[-1] if times else 0.0)
            j = bisect.bisect_right(longer, edge)
            out.append(
                longer[rng.randrange(j, len(longer))] if j < len(longer) else edge + tail_mean_s
            )
        return out

    def to_state(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "at": self._at[self._lo :],
            "wait": self._wait[self._lo :],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SuspensionCohort:
        cohort = cls(int(state.get("capacity", 2000)))
        cohort._at = [float(t) for t in state.get("at", [])]
        cohort._wait = [None if w is None else float(w) for w in state.get("wait", [])]
        if len(cohort._at) != len(cohort._wait):
            raise ValueError("cohort state: 'at' and 'wait' differ in length")
        return cohort
