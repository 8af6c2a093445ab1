"""The spread of the real idle gap around a point prediction, learned online.

A gap predictor (the stop-reason median of :mod:`tenure.service.policy.gap`, or any other source
of ``SessionHint.expected_gap_s``) gives one number per session. Agent gaps are heavy-tailed and
the prediction is often wrong by a factor of ten, so a policy that holds blocks until the
*predicted* wake-up both overrates sessions that will come back much later and misjudges when a
silent session is really overdue. This module keeps, per bucket of the prediction (half-octave
bins of the predicted gap; one bin for "no prediction"), a bounded window of the gaps that
followed it, and answers the two questions a density policy asks about a session idle for
``age`` seconds: how likely it is to come back after a given age (survival), and how long it
will still be held if kept until then (mean residual gap). Both come from the empirical
distribution conditioned on the gap exceeding ``age``. The predictor itself is not touched:
this is a calibration of whatever prediction the caller feeds.

Cold start: a bucket with fewer than ``min_samples`` observations answers from a spread of the
point prediction itself (half, one and two times it), so a fresh policy behaves like one that
trusts the prediction to within a factor of two.

:class:`HitYield` is the second thing a policy needs: what share of a session's host copy its
next turn actually loads. A copy is useless for the blocks the GPU prefix cache still holds when
the session comes back (vLLM looks the host tier up from the GPU hit on), and the GPU's LRU lets
go of a session once enough other blocks have been computed after its last use. So the yield is
learned, per half-octave bin of a distance (the blocks computed between the session's last use
and its lookup, or the gap in seconds where no such clock is kept), from what lookups find:
blocks loaded over blocks the session held.
"""

from __future__ import annotations

import math
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Sequence
from itertools import accumulate
from typing import Any

__all__ = ["GapSpread", "HitYield", "Residual"]


#: The lowest bin: everything at or under 1/8.
_LOW = -6


def _bin(x: float) -> int:
    """Half-octave bin of a positive quantity (everything under 1/8 in one bin)."""
    return math.floor(2.0 * math.log2(max(x, 0.125)))


class HitYield:
    """Share of a held copy the next turn loads, by half-octave bin of a distance.

    ``min_samples`` is read when a bin is observed: set it before the first observation.
    """

    def __init__(self, window: int = 256, min_samples: int = 8, prior: float = 1.0) -> None:
        self.window = window
        self.min_samples = min_samples
        self.prior = prior
        self._samples: dict[int, deque[float]] = {}
        self._sums: dict[int, float] = {}
        #: The mean of each bin with ``min_samples`` or more (the others read as the prior),
        #: kept up to date by ``observe``: a query is one dict lookup, no call.
        self._table: dict[int, float] = {}
        #: Bumped on every observation: the residual caches built on the yields check it.
        self.version = 0
        #: ``floor()``'s answer at ``version`` (a query cache: not decision state, so a copy or
        #: a fingerprint leaves it out).
        self._floor_cache: tuple[int, float] = (-1, prior)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "_floor_cache"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._floor_cache = (-1, self.prior)

    def observe(self, distance: float, share: float) -> None:
        if distance < 0 or distance != distance or share != share:
            return
        share = min(1.0, max(0.0, share))
        key = _bin(distance)
        samples = self._samples.get(key)
        if samples is None:
            samples = self._samples[key] = deque()
            self._sums[key] = 0.0
        if len(samples) == self.window:
            self._sums[key] -= samples.popleft()
        samples.append(share)
        self._sums[key] += share
        if len(samples) >= self.min_samples:
            self._table[key] = max(0.0, self._sums[key] / len(samples))
        self.version += 1

    def of(self, distance: float) -> float:
        return self._table.get(_bin(distance), self.prior)

    def floor(self) -> float:
        """The least yield any distance reads (a bin's mean, or the prior of a bin with too few
        samples): a lower bound on every :meth:`mean_along`, so a ranking can skip the mean of a
        candidate that cannot come next."""
        version, low = self._floor_cache
        if version != self.version:
            low = min(self.prior, min(self._table.values(), default=self.prior))
            self._floor_cache = (self.version, low)
        return low

    def mean_along(self, distance: float, rate: float, age: float, gaps: Sequence[float]) -> float:
        """The mean of ``of(distance + rate * (g - age))`` over ``gaps`` (not empty).

        The density policy's inner loop (every scored candidate, every point of its gap
        spread): written out, with ``_bin`` inlined, because a call per point was most of a
        decision's cost once lookups are reported. Equal to the plain mean float for float
        (``tests/policy/test_density.py``).
        """
        table, prior, log2, floor = self._table, self.prior, math.log2, math.floor
        ds = [distance + rate * (g - age) for g in gaps]
        return sum(
            [table.get(floor(2.0 * log2(d)) if d > 0.125 else _LOW, prior) for d in ds]
        ) / len(ds)


class Residual:
    """The gaps of one bucket that exceed an age: how many, their mean remaining time, and a
    few of them evenly spaced by rank (for expectations of a function of the gap)."""

    __slots__ = ("_gaps", "_start", "_step", "mean_left", "survivors", "total")

    def __init__(
        self,
        survivors: int,
        total: int,
        mean_left: float,
        gaps: Sequence[float] = (),
        start: int = 0,
        step: int = 1,
    ) -> None:
        self.survivors = survivors
        self.total = total
        self.mean_left = mean_left
        self._gaps, self._start, self._step = gaps, start, step

    @property
    def points(self) -> Sequence[float]:
        """The surviving gaps at the midpoints of equal-rank slices (built only when asked:
        most decisions never need them)."""
        return self._gaps[self._start :: self._step]


class GapSpread:
    """Per prediction bucket, the recent real gaps (sorted, with suffix sums for residuals)."""

    def __init__(self, window: int = 512, min_samples: int = 8, points: int = 16) -> None:
        if window < 1 or min_samples < 1 or points < 1:
            raise ValueError("window, min_samples and points must be >= 1")
        self.window = window
        self.min_samples = min_samples
        self.points = points
        self._arrival: dict[int, deque[float]] = {}
        self._sorted: dict[int, list[float]] = {}
        # Suffix sums of the sorted gaps, rebuilt lazily after an observation (a query cache:
        # not decision state, so ``fingerprint`` leaves it out by its name).
        self._suffix_cache: dict[int, list[float]] = {}

    def __getstate__(self) -> dict[str, Any]:
        # The suffix sums are a query cache: a copy or a fingerprint leaves them out.
        return {k: v for k, v in vars(self).items() if k != "_suffix_cache"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        vars(self).update(state)
        self._suffix_cache = {}

    @staticmethod
    def bucket(predicted: float | None) -> int:
        """Half-octave bin of a predicted gap; ``-1000`` for no prediction."""
        if predicted is None or predicted != predicted:
            return -1000
        return _bin(predicted)

    def observe(self, bucket: int, gap: float) -> None:
        if gap < 0 or gap != gap:
            return
        window = self._arrival.get(bucket)
        ordered = self._sorted.get(bucket)
        if window is None or ordered is None:
            window = self._arrival[bucket] = deque()
            ordered = self._sorted[bucket] = []
        if len(window) == self.window:
            oldest = window.popleft()
            del ordered[bisect_right(ordered, oldest) - 1]
        window.append(gap)
        insort(ordered, gap)
        self._suffix_cache.pop(bucket, None)

    def samples(self, bucket: int) -> int:
        return len(self._sorted.get(bucket, ()))

    def residual(self, bucket: int, predicted: float | None, age: float) -> Residual:
        """Of the bucket's gaps, those longer than ``age``: their mean ``gap - age``, and up to
        ``points`` of them evenly spaced by rank."""
        ordered = self._sorted.get(bucket)
        if ordered is None or len(ordered) < self.min_samples:
            point = predicted if predicted is not None else 0.0
            left = [g for g in (0.5 * point, point, 2.0 * point) if g > age]
            if not left:
                return Residual(0, 3, 0.0, ())
            return Residual(len(left), 3, sum(left) / len(left) - age, left)
        suffix = self._suffix_cache.get(bucket)
        if suffix is None:
            # suffix[i] = sum(ordered[i:]); one C-level pass per bucket change.
            suffix = list(accumulate(reversed(ordered), initial=0.0))[::-1]
            self._suffix_cache[bucket] = suffix
        i = bisect_right(ordered, age)
        survivors = len(ordered) - i
        if survivors == 0:
            return Residual(0, len(ordered), 0.0, ())
        step = max(1, survivors // self.points)
        mean = suffix[i] / survivors - age
        return Residual(survivors, len(ordered), mean, ordered, i + step // 2, step)
