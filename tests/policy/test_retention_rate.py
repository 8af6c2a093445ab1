"""The suspension-rate estimators on synthetic Poisson streams with known and changing rates."""

from __future__ import annotations

import random

import pytest

from tenure.service.policy.rate import (
    ChangePointRate,
    DecayingRate,
    SlidingWindowRate,
    rate_estimator,
    rate_estimator_from_state,
    rate_lower_bound,
)
from tenure.service.policy.retention import LambdaEstimator

SPECS = ("window:900", "decay:900", "changepoint:300")


def _poisson(rate: float, start: float, end: float, rng: random.Random) -> list[float]:
    out: list[float] = []
    at = start
    while True:
        at += rng.expovariate(rate)
        if at >= end:
            return out
        out.append(at)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("rate", [0.1, 0.7])
def test_known_rate_is_recovered(spec: str, rate: float) -> None:
    rng = random.Random(7)
    est = rate_estimator(spec)
    errors = []
    for at in _poisson(rate, 0.0, 4 * 3600.0, rng):
        est.observe(at)
        if at > 1800:
            errors.append(abs(est.rate(at) - rate) / rate)
    assert sum(errors) / len(errors) < 0.12
    assert est.rate(4 * 3600.0) == pytest.approx(rate, rel=0.25)


@pytest.mark.parametrize("spec", SPECS)
def test_cold_start_does_not_read_as_a_burst_or_a_lull(spec: str) -> None:
    rng = random.Random(3)
    est = rate_estimator(spec)
    events = _poisson(0.5, 0.0, 300.0, rng)
    for at in events:
        est.observe(at)
    assert est.rate(300.0) == pytest.approx(0.5, rel=0.3)


def test_change_point_follows_a_step_faster_than_a_long_window() -> None:
    """0.2/s for two hours, then 1.0/s: 10 minutes later the change-point estimate has moved,
    the 30-minute window has not caught up yet, and both read the new rate after an hour."""
    rng = random.Random(11)
    events = _poisson(0.2, 0.0, 7200.0, rng) + _poisson(1.0, 7200.0, 7200.0 + 3600, rng)
    change, window = ChangePointRate(short_s=300.0), SlidingWindowRate(window_s=1800.0)
    for at in events:
        change.observe(at)
        window.observe(at)
        if at <= 7800.0:
            t = at
    assert change.rate(t) == pytest.approx(1.0, rel=0.2)
    assert window.rate(t) < 0.5
    assert change.changes >= 1
    end = 7200.0 + 3600
    assert change.rate(end) == pytest.approx(1.0, rel=0.1)
    assert window.rate(end) == pytest.approx(1.0, rel=0.15)


def test_change_point_keeps_one_segment_on_a_steady_stream() -> None:
    rng = random.Random(5)
    est = ChangePointRate(short_s=300.0, z=3.0)
    for at in _poisson(0.5, 0.0, 6 * 3600.0, rng):
        est.observe(at)
    assert est.changes <= 2  # a 3-sigma test on ~70 windows: rarely, never often


def test_silence_after_load_reads_low_without_new_events() -> None:
    rng = random.Random(2)
    est = ChangePointRate(short_s=300.0)
    last = 0.0
    for at in _poisson(1.0, 0.0, 3600.0, rng):
        est.observe(at)
        last = at
    assert est.rate(last + 900.0) < 0.1  # rate() sees the lull; it changed no state
    assert est.rate(last) == pytest.approx(1.0, rel=0.2)


@pytest.mark.parametrize("spec", SPECS)
def test_state_round_trips(spec: str) -> None:
    rng = random.Random(1)
    est = rate_estimator(spec)
    for at in _poisson(0.3, 0.0, 2000.0, rng):
        est.observe(at)
    again = rate_estimator_from_state(est.to_state())
    assert type(again) is type(est)
    assert again.rate(2100.0) == pytest.approx(est.rate(2100.0))


def test_legacy_name_and_out_of_order_events() -> None:
    assert LambdaEstimator is SlidingWindowRate
    est = DecayingRate(tau_s=100.0)
    assert est.rate(5.0) == 0.0
    window = SlidingWindowRate(window_s=100.0, min_span_s=10.0)
    for at in (10.0, 30.0, 20.0, 40.0):  # replicas' clocks interleave
        window.observe(at)
    assert window.rate(40.0) == pytest.approx(4 / 30.0)


@pytest.mark.parametrize(
    ("spec", "field"),
    [("median:10", "unknown rate estimator"), ("window:x", "window_s"), ("decay:-5", "tau_s")],
)
def test_bad_specs_name_the_problem(spec: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        rate_estimator(spec)


@pytest.mark.parametrize("spec", SPECS)
def test_lower_bound_sits_about_one_standard_error_below(spec: str) -> None:
    """Over many independent streams, the z = 1 bound is under the true rate about 84% of
    the time (a Poisson count's one-sided 1-sigma bound), and never above the estimate."""
    under = 0
    trials = 200
    for seed in range(trials):
        rng = random.Random(seed)
        est = rate_estimator(spec)
        for at in _poisson(0.3, 0.0, 3600.0, rng):
            est.observe(at)
        bound = rate_lower_bound(est, 3600.0, 1.0)
        assert bound <= est.rate(3600.0)
        under += bound < 0.3
    assert 0.7 < under / trials < 0.97
    assert rate_lower_bound(rate_estimator(spec), 0.0, 1.0) == 0.0
