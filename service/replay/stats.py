"""Statistics over replay runs: percentiles, bootstrap intervals and paired deltas.

Runs of one policy at several seeds are pooled. Confidence intervals come from a percentile
bootstrap, either per turn (turns resampled within each seed) or clustered by session (root
sessions resampled within each seed, each bringing all its turns, which respects the
correlation between a session's turns). Paired deltas compare two policies on the same seeds:
the same arrivals and gaps, so the same turns, and one session resample applied to both, which
cancels the shared arrival-schedule variance.
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

    def clusters(self) -> list[NDArray[np.int64]]:
        """Turn indices grouped by root session."""
        order = np.argsort(self.roots, kind="stable")
        sorted_roots = self.roots[order]
        cuts = np.flatnonzero(np.diff(sorted_roots)) + 1
        return list(np.split(order, cuts))


def percentile(samples: Sequence[SeedSample], q: float) -> float:
    pooled = np.concatenate([s.values for s in samples])
    return float(np.percentile(pooled, q)) if pooled.size else float("nan")


def bootstrap_ci(
    samples: Sequence[SeedSample], q: float, boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Per-turn percentile-bootstrap interval of the pooled ``q``-th percentile."""
    if boot <= 0 or not samples:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    stats: list[float] = []
    for start in range(0, boot, _CHUNK):
        reps = min(_CHUNK, boot - start)
        parts = [
            s.values[rng.integers(0, s.values.size, size=(reps, s.values.size))] for s in samples
        ]
        stats.extend(np.percentile(np.concatenate(parts, axis=1), q, axis=1).tolist())
    return _interval(stats, level)


def _cluster_draw(rng: np.random.Generator, clusters: list[NDArray[np.int64]]) -> NDArray[np.int64]:
    picks = rng.integers(0, len(clusters), size=len(clusters))
    return np.concatenate([clusters[i] for i in picks])


def clustered_ci(
    samples: Sequence[SeedSample], q: float, boot: int, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Session-clustered bootstrap interval of the pooled ``q``-th percentile."""
    if boot <= 0 or not samples:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    clusters = [s.clusters() for s in samples]
    stats = []
    for _ in range(boot):
        pooled = np.concatenate(
            [s.values[_cluster_draw(rng, c)] for s, c in zip(samples, clusters, strict=True)]
        )
        stats.append(float(np.percentile(pooled, q)))
    return _interval(stats, level)


def paired_delta(
    treated: Sequence[SeedSample],
    control: Sequence[SeedSample],
    q: float,
    boot: int,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """``[delta, lo, hi]`` of ``percentile(treated) - percentile(control)``, paired by seed.

    Each seed's two samples must list the same turns in the same order.
    """
    for one, other in zip(treated, control, strict=True):
        if one.values.size != other.values.size or not np.array_equal(one.roots, other.roots):
            raise ValueError("paired samples must cover the same turns")
    point = percentile(treated, q) - percentile(control, q)
    if boot <= 0:
        return (point, float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    clusters = [s.clusters() for s in treated]
    stats = []
    for _ in range(boot):
        draws = [_cluster_draw(rng, c) for c in clusters]
        a = np.concatenate([s.values[d] for s, d in zip(treated, draws, strict=True)])
        b = np.concatenate([s.values[d] for s, d in zip(control, draws, strict=True)])
        stats.append(float(np.percentile(a, q) - np.percentile(b, q)))
    lo, hi = _interval(stats, level)
    return (point, lo, hi)


def _interval(stats: Sequence[float], level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(np.asarray(stats), [tail, 100.0 - tail])
    return (float(lo), float(hi))
