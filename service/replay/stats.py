"""Statistics over replay runs: percentiles, bootstrap intervals and paired deltas.

Runs of one policy at several seeds are pooled. Confidence intervals come from a percentile
bootstrap, either per turn (turns resampled within each seed) or clustered by session (root
sessions resampled within each seed, each bringing all its turns, which respects the
correlation between a session's turns). Paired deltas compare two policies on the same seeds:
the same arrivals and gaps, so the same turns, and one session resample applied to both, which
cancels the shared arrival-schedule variance.

A resample is represented by multiplicity weights over the pooled turns (multinomial counts), so
a replicate's percentile is a weighted percentile over values sorted once: the bootstrap runs in
vectorised chunks instead of concatenating resampled arrays. Replicates use the inverted-CDF
percentile; point estimates use numpy's default (linear) percentile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["SeedSample", "bootstrap_ci", "clustered_ci", "paired_delta", "percentile"]

_CHUNK = 64  # bootstrap replicates drawn at once (bounds memory)


@dataclass(frozen=True, slots=True)
class SeedSample:
    """One run's per-turn values in a canonical turn order, with each turn's root session."""

    values: NDArray[np.float64]
    roots: NDArray[np.int64]


def percentile(samples: Sequence[SeedSample], q: float) -> float:
    pooled = np.concatenate([s.values for s in samples])
    return float(np.percentile(pooled, q)) if pooled.size else float("nan")


class _Pooled:
    """Pooled values sorted once, with the resampling unit (turn or cluster) of each position.

    A resample is a matrix of multiplicity counts per unit (multinomial draws), so a
    replicate's percentile is a weighted percentile over the values sorted once; only the upper
    tail (three times its share, for high percentiles) is scanned.
    """

    def __init__(self, samples: Sequence[SeedSample], q: float, clustered: bool) -> None:
        values = np.concatenate([s.values for s in samples])
        ids = []
        self.units: list[int] = []  # units per seed
        offset = 0
        for s in samples:
            if clustered:
                _uniq, inverse = np.unique(s.roots, return_inverse=True)
                k = int(inverse.max()) + 1 if inverse.size else 0
            else:
                inverse, k = np.arange(s.values.size), s.values.size
            ids.append(inverse.astype(np.int64) + offset)
            self.units.append(k)
            offset += k
        self.clustered = clustered
        unit = np.concatenate(ids)
        order = np.argsort(values, kind="stable")
        self.sorted = values[order]
        self.unit_sorted = unit[order]
        self.sizes = np.bincount(unit, minlength=offset)
        self.q = q
        n = values.size
        keep = n if q < 75 else min(n, int(np.ceil(n * (1.0 - q / 100.0) * 3.0)) + 200)
        self.tail_start = n - keep

    def draw(self, rng: np.random.Generator, reps: int) -> NDArray[np.int64]:
        """Multiplicity counts per unit: each seed's units resampled with replacement."""
        parts = []
        for k in self.units:
            if self.clustered:
                parts.append(rng.multinomial(k, np.full(k, 1.0 / k), size=reps))
            else:  # many units: integer draws and a bincount beat a wide multinomial
                draws = rng.integers(0, k, size=(reps, k)) + (np.arange(reps) * k)[:, None]
                parts.append(np.bincount(draws.ravel(), minlength=reps * k).reshape(reps, k))
        return np.concatenate(parts, axis=1)

    def percentiles(self, counts: NDArray[np.int64]) -> NDArray[np.float64]:
        """Inverted-CDF percentile per resample (row of unit ``counts``)."""
        totals = counts @ self.sizes
        target = np.maximum(np.ceil(self.q / 100.0 * totals), 1)
        tail = counts[:, self.unit_sorted[self.tail_start :]]
        below = totals - tail.sum(axis=1)
        out = np.empty(counts.shape[0])
        ok = target > below
        cum = np.cumsum(tail[ok], axis=1) + below[ok, None]
        out[ok] = self.sorted[self.tail_start + np.argmax(cum >= target[ok, None], axis=1)]
        if not ok.all():
            full = np.cumsum(counts[~ok][:, self.unit_sorted], axis=1)
            out[~ok] = self.sorted[np.argmax(full >= target[~ok, None], axis=1)]
        return out


def _interval(stats: NDArray[np.float64], level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return (float(lo), float(hi))


def _percentile_ci(
    samples: Sequence[SeedSample], q: float, boot: int, seed: int, level: float, clustered: bool
) -> tuple[float, float]:
    if boot <= 0 or not samples:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    pooled = _Pooled(samples, q, clustered=clustered)
    stats = [
        pooled.percentiles(pooled.draw(rng, min(_CHUNK, boot - start)))
        for start in range(0, boot, _CHUNK)
    ]
    return _interval(np.concatenate(stats), level)


def bootstrap_ci(
    samples: Sequence[SeedSample], q: float, boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Per-turn percentile-bootstrap interval of the pooled ``q``-th percentile."""
    return _percentile_ci(samples, q, boot, seed, level, clustered=False)


def clustered_ci(
    samples: Sequence[SeedSample], q: float, boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Session-clustered bootstrap interval of the pooled ``q``-th percentile."""
    return _percentile_ci(samples, q, boot, seed, level, clustered=True)


def paired_delta(
    treated: Sequence[SeedSample],
    control: Sequence[SeedSample],
    q: float,
    boot: int,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """``[delta, lo, hi]`` of ``percentile(treated) - percentile(control)``, paired by seed.

    Each seed's two samples must list the same turns in the same order; one session-clustered
    resample is applied to both.
    """
    for one, other in zip(treated, control, strict=True):
        if one.values.size != other.values.size or not np.array_equal(one.roots, other.roots):
            raise ValueError("paired samples must cover the same turns")
    point = percentile(treated, q) - percentile(control, q)
    if boot <= 0:
        return (point, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    a = _Pooled(treated, q, clustered=True)
    b = _Pooled(control, q, clustered=True)  # same units in the same order as ``a``
    stats = []
    for start in range(0, boot, _CHUNK):
        counts = a.draw(rng, min(_CHUNK, boot - start))
        stats.append(a.percentiles(counts) - b.percentiles(counts))
    lo, hi = _interval(np.concatenate(stats), level)
    return (point, lo, hi)
