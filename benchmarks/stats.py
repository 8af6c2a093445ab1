"""The one percentile routine of the benchmarks: of raw samples, and of a Prometheus histogram."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["bucket_quantile", "percentile", "sorted_percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``: the nearest-rank sample, NaN when empty."""
    return sorted_percentile(sorted(values), q)


def sorted_percentile(ordered: Sequence[float], q: float) -> float:
    """:func:`percentile` of samples already sorted (sort once, read many quantiles)."""
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def bucket_quantile(buckets: Mapping[float, float], q: float) -> float:
    """Quantile of a cumulative histogram (``le -> count``), interpolated inside its bucket."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return float("nan")
    target = q * ordered[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= target:
            if le == float("inf"):
                return lower_le
            span = count - lower_count
            return lower_le + (le - lower_le) * ((target - lower_count) / span if span else 0.0)
        lower_le, lower_count = le, count
    return lower_le
