"""Online estimates of an event rate (the suspension rate lambda) from event times.

Three estimators with one interface (``observe(now)``, ``rate(now)``, ``to_state()``,
``from_state()``); which one the retention controller uses was chosen by the drift replay
(``tenure replay ttl``, ``results/ttl/README.md``), not by taste:

* :class:`SlidingWindowRate`: events in the last ``window_s`` over the window (before a full
  window has elapsed, over the time observed, at least ``min_span_s``);
* :class:`DecayingRate`: exponentially weighted count, time constant ``tau_s``, corrected for
  the start-up bias so a cold estimator does not read low;
* :class:`ChangePointRate`: the rate since the last detected change, over at most
  ``max_window_s``; a change is declared when the last ``short_s`` seconds hold a count the
  current estimate makes implausible (a two-sided Poisson test at ``z`` standard deviations).

Times are seconds, rates per second. ``rate`` never changes state.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = [
    "ESTIMATORS",
    "ChangePointRate",
    "DecayingRate",
    "RateEstimator",
    "SlidingWindowRate",
    "rate_estimator",
    "rate_estimator_from_state",
    "rate_lower_bound",
]


def _positive(name: str, value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


class _EventLog:
    """Event times in order, with counts over intervals by bisection (amortised pruning)."""

    __slots__ = ("_lo", "_times")

    def __init__(self, times: list[float] | None = None) -> None:
        self._times: list[float] = sorted(times or [])
        self._lo = 0

    def add(self, at: float) -> None:
        times = self._times
        if times and at < times[-1]:
            bisect.insort(times, at, lo=self._lo)
        else:
            times.append(at)

    def drop_before(self, cutoff: float) -> None:
        self._lo = bisect.bisect_left(self._times, cutoff, lo=self._lo)
        if self._lo > 1024 and self._lo * 2 > len(self._times):
            del self._times[: self._lo]
            self._lo = 0

    def count(self, start: float, end: float) -> int:
        """Events with ``start <= t <= end``."""
        times, lo = self._times, self._lo
        return bisect.bisect_right(times, end, lo=lo) - bisect.bisect_left(times, start, lo=lo)

    def __len__(self) -> int:
        return len(self._times) - self._lo

    def as_list(self) -> list[float]:
        return self._times[self._lo :]


class RateEstimator(Protocol):
    kind: str

    def observe(self, now: float) -> None: ...

    def rate(self, now: float) -> float: ...

    def evidence(self, now: float) -> tuple[float, float]:
        """``(events, seconds)`` behind :meth:`rate` (its ratio), ``events`` scaled so that
        ``1/sqrt(events)`` is the estimate's relative standard error."""
        ...

    def to_state(self) -> dict[str, Any]: ...


class SlidingWindowRate:
    """Events in a sliding window over its length."""

    kind = "window"

    def __init__(self, window_s: float = 900.0, min_span_s: float = 60.0) -> None:
        self.window_s = _positive("window_s", window_s)
        self.min_span_s = _positive("min_span_s", min_span_s)
        self._events = _EventLog()
        self._first: float | None = None

    def observe(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._events.add(now)
        self._events.drop_before(now - self.window_s)

    def rate(self, now: float) -> float:
        count, span = self.evidence(now)
        return count / span

    def evidence(self, now: float) -> tuple[float, float]:
        if self._first is None:
            return 0.0, self.min_span_s
        count = self._events.count(now - self.window_s, now)
        return float(count), min(self.window_s, max(self.min_span_s, now - self._first))

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "window_s": self.window_s,
            "min_span_s": self.min_span_s,
            "events": self._events.as_list(),
            "first": self._first,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> SlidingWindowRate:
        est = cls(float(state.get("window_s", 900.0)), float(state.get("min_span_s", 60.0)))
        est._events = _EventLog([float(t) for t in state.get("events", [])])
        first = state.get("first")
        est._first = None if first is None else float(first)
        return est


class DecayingRate:
    """Exponentially decaying event count over ``tau_s``, bias-corrected at start-up."""

    kind = "decay"

    def __init__(self, tau_s: float = 900.0, min_span_s: float = 60.0) -> None:
        self.tau_s = _positive("tau_s", tau_s)
        self.min_span_s = _positive("min_span_s", min_span_s)
        self._weight = 0.0  # sum of exp(-(t_last - t_i) / tau) over events so far
        self._last: float | None = None
        self._first: float | None = None

    def observe(self, now: float) -> None:
        if self._last is None:
            self._first = now
            self._weight = 1.0
        else:
            self._weight = self._weight * math.exp(-max(0.0, now - self._last) / self.tau_s) + 1
        self._last = now

    def rate(self, now: float) -> float:
        weight, mass = self.evidence(now)
        return weight / mass

    def evidence(self, now: float) -> tuple[float, float]:
        if self._last is None or self._first is None:
            return 0.0, self.min_span_s
        weight = self._weight * math.exp(-max(0.0, now - self._last) / self.tau_s)
        # Over a history of length h the kernel's mass is tau * (1 - exp(-h / tau)), not tau.
        span = max(self.min_span_s, now - self._first)
        mass = self.tau_s * -math.expm1(-span / self.tau_s)
        # An exponentially weighted Poisson count has variance rate * tau / 2: twice the
        # weight is the count with the same relative error.
        return 2 * weight, 2 * mass

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tau_s": self.tau_s,
            "min_span_s": self.min_span_s,
            "weight": self._weight,
            "last": self._last,
            "first": self._first,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> DecayingRate:
        est = cls(float(state.get("tau_s", 900.0)), float(state.get("min_span_s", 60.0)))
        est._weight = float(state.get("weight", 0.0))
        last, first = state.get("last"), state.get("first")
        est._last = None if last is None else float(last)
        est._first = None if first is None else float(first)
        return est


class ChangePointRate:
    """The rate since the last detected change in the event rate (at most ``max_window_s``).

    A segment keeps every event since its start. On each event the last ``short_s`` seconds
    are tested against the rate of the segment before them; a count more than ``z`` standard
    deviations (Poisson) away starts a new segment at ``now - short_s``. So a step in load is
    followed within about ``short_s``, while a steady load is averaged over the whole segment
    (up to ``max_window_s``), which a fixed window cannot do at once. The test runs at every
    event, so a segment sees many of them: ``z = 4``, not 3 (at 3 the stationary Table 6 cells
    saw several false changes per 4,000 suspensions, and each restart begins on the burst that
    triggered it, so it reads high).
    """

    kind = "changepoint"

    def __init__(
        self,
        short_s: float = 300.0,
        max_window_s: float = 3600.0,
        z: float = 4.0,
        min_span_s: float = 60.0,
    ) -> None:
        self.short_s = _positive("short_s", short_s)
        self.max_window_s = _positive("max_window_s", max_window_s)
        if self.max_window_s < self.short_s:
            raise ValueError("max_window_s must be >= short_s")
        self.z = _positive("z", z)
        self.min_span_s = _positive("min_span_s", min_span_s)
        self._events = _EventLog()
        self._start: float | None = None  # segment start
        self.changes = 0

    def _changed(self, now: float) -> bool:
        """Whether the last ``short_s`` contradict the segment's rate before them."""
        start = self._start
        if start is None:
            return False
        split = now - self.short_s
        before = now - start - self.short_s
        if before < self.short_s:  # too little history to test against
            return False
        n_recent = self._events.count(split, now)
        n_before = self._events.count(start, split) - self._events.count(split, split)
        expected = n_before / before * self.short_s
        # Poisson test; with no events before, any burst of more than z^2 events is a change.
        spread = math.sqrt(max(expected, 1.0))
        return abs(n_recent - expected) > self.z * spread

    def observe(self, now: float) -> None:
        if self._start is None:
            self._start = now
        self._events.add(now)
        if self._changed(now):
            self._start = now - self.short_s
            self.changes += 1
        start = max(self._start, now - self.max_window_s)
        self._start = start
        self._events.drop_before(start)

    def rate(self, now: float) -> float:
        count, span = self.evidence(now)
        return count / span

    def evidence(self, now: float) -> tuple[float, float]:
        if self._start is None:
            return 0.0, self.min_span_s
        # A silence after a busy spell is a change too; find it without changing state.
        start = now - self.short_s if self._changed(now) else self._start
        start = max(start, now - self.max_window_s)
        return float(self._events.count(start, now)), max(self.min_span_s, now - start)

    def to_state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "short_s": self.short_s,
            "max_window_s": self.max_window_s,
            "z": self.z,
            "min_span_s": self.min_span_s,
            "events": self._events.as_list(),
            "start": self._start,
            "changes": self.changes,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ChangePointRate:
        est = cls(
            float(state.get("short_s", 300.0)),
            float(state.get("max_window_s", 3600.0)),
            float(state.get("z", 4.0)),
            float(state.get("min_span_s", 60.0)),
        )
        est._events = _EventLog([float(t) for t in state.get("events", [])])
        start = state.get("start")
        est._start = None if start is None else float(start)
        est.changes = int(state.get("changes", 0))
        return est


#: Estimator kinds by name, with the parameter their single-number spec sets.
ESTIMATORS: dict[str, tuple[type[Any], str]] = {
    "window": (SlidingWindowRate, "window_s"),
    "decay": (DecayingRate, "tau_s"),
    "changepoint": (ChangePointRate, "short_s"),
}


def rate_estimator(spec: str) -> RateEstimator:
    """``'window:900'``, ``'decay:600'``, ``'changepoint:300'`` (seconds) -> an estimator."""
    kind, _, value = spec.partition(":")
    if kind not in ESTIMATORS:
        raise ValueError(f"unknown rate estimator {kind!r}; valid: {', '.join(sorted(ESTIMATORS))}")
    cls, param = ESTIMATORS[kind]
    if not value:
        return cls()  # type: ignore[no-any-return]
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"rate estimator {spec!r}: {param} must be a number") from None
    return cls(**{param: seconds})  # type: ignore[no-any-return]


def rate_lower_bound(estimator: RateEstimator, now: float, z: float) -> float:
    """The rate ``z`` standard errors below the estimate (Poisson), never below zero.

    The host timer's cost is lopsided in the rate: a timer too short forfeits host hits at once,
    one a little too long costs almost nothing (``results/ttl/README.md``), so the controller
    prices with a rate it is confident the load reaches.
    """
    count, span = estimator.evidence(now)
    if z <= 0:
        return count / span
    return max(0.0, count - z * math.sqrt(count)) / span


def rate_estimator_from_state(state: Mapping[str, Any]) -> RateEstimator:
    kind = str(state.get("kind", "window"))
    if kind not in ESTIMATORS:
        raise ValueError(f"unknown rate estimator kind {kind!r} in state")
    cls = ESTIMATORS[kind][0]
    return cls.from_state(state)  # type: ignore[no-any-return]
