"""Bootstrap intervals and paired deltas."""

from __future__ import annotations

import numpy as np

from tenure.service.replay.stats import (
    SeedSample,
    bootstrap_ci,
    clustered_ci,
    paired_delta,
    percentile,
)


def _sample(seed: int, shift: float = 0.0) -> SeedSample:
    rng = np.random.default_rng(seed)
    roots = np.repeat(np.arange(40), 10)
    values = rng.exponential(10.0, size=400) + rng.normal(0, 3, size=40)[roots] + shift
    return SeedSample(values, roots.astype(np.int64))


def test_intervals_cover_the_point_estimate() -> None:
    samples = [_sample(0), _sample(1)]
    point = percentile(samples, 95)
    lo, hi = bootstrap_ci(samples, 95, boot=200)
    clo, chi = clustered_ci(samples, 95, boot=200)
    assert lo < point < hi and clo < point < chi
    assert chi - clo > 0


def test_paired_delta_of_a_shift() -> None:
    base = [_sample(0), _sample(1)]
    same = paired_delta(base, base, 95, boot=100)
    assert same == (0.0, 0.0, 0.0)
    shifted = [_sample(0, shift=-5.0), _sample(1, shift=-5.0)]
    delta, lo, hi = paired_delta(shifted, base, 95, boot=100)
    assert delta == np.float64(-5.0) or abs(delta + 5.0) < 1e-9
    assert lo <= -5.0 + 1e-9 and hi >= -5.0 - 1e-9 and hi < 0
