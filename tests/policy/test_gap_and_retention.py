"""Gap prediction and the load-indexed host TTL against the seed's formulas and numbers."""

from __future__ import annotations

import math

import pytest

from tenure.service.policy import GapPredictor
from tenure.service.policy.lifecycle import RetentionSettings, on_response, on_suspend
from tenure.service.policy.retention import (
    DEFAULT_PRICE,
    LambdaEstimator,
    PriceVector,
    bound_by_declared_retention,
    host_ttl_seconds,
    lambda_crit,
)
from tenure.service.policy.retention_costs import choose_regime


def test_gap_predictor_learns_bimodal_gaps_by_stop_reason() -> None:
    gp = GapPredictor(min_samples=3)
    assert gp.predict("tool_use") == 9.0  # prior until enough samples
    for gap in (2.0, 3.0, 4.0, 100.0):
        gp.observe("tool_use", gap)
    for gap in (600.0, 900.0, 1200.0):
        gp.observe("end_turn", gap)
    assert gp.predict("tool_calls") == pytest.approx(3.5)  # OpenAI's name maps to the same class
    assert gp.predict("stop") == pytest.approx(900.0)
    restored = GapPredictor.from_state(gp.to_state())
    assert restored.predict("tool_use") == gp.predict("tool_use")


def test_gap_predictor_ignores_negative_and_nan() -> None:
    gp = GapPredictor(min_samples=1)
    gp.observe("tool_use", -1.0)
    gp.observe("tool_use", math.nan)
    assert gp.samples("tool_use") == 0


def test_price_vector_reproduces_seed_break_evens() -> None:
    """Seed 002, Table 3, H100 NVL: t1 = 1.13 s, t* = 109 s."""
    assert DEFAULT_PRICE.t1 == pytest.approx(1.13, abs=0.01)
    assert DEFAULT_PRICE.t_star == pytest.approx(109, abs=1)


def test_host_ttl_is_infinite_below_lambda_crit_and_shrinks_above() -> None:
    c2, w_ref = 425.0, 1800.0
    crit = lambda_crit(c2, w_ref)
    assert host_ttl_seconds(0.9 * crit, DEFAULT_PRICE, c2, w_ref) is None
    t2_a = host_ttl_seconds(2 * crit, DEFAULT_PRICE, c2, w_ref)
    t2_b = host_ttl_seconds(3 * crit, DEFAULT_PRICE, c2, w_ref)
    assert t2_a is not None and t2_b is not None and t2_b < t2_a
    # At 2 lambda_crit: alpha2 = crit * beta3 / c2, t2 = (beta3 - beta2) / alpha2.
    expected = (DEFAULT_PRICE.beta3 - DEFAULT_PRICE.beta2) / (crit * DEFAULT_PRICE.beta3 / c2)
    assert t2_a == pytest.approx(expected)


def test_regime_controller_prefers_ttl_for_short_and_long_waits_and_retain_for_short() -> None:
    c2, w_ref = 10.0, 100.0
    lam = 3 * lambda_crit(c2, w_ref)
    t2 = host_ttl_seconds(lam, DEFAULT_PRICE, c2, w_ref)
    assert t2 is not None
    assert choose_regime([0.1 * t2] * 50, lam, DEFAULT_PRICE, c2, w_ref).regime == "retain"
    # Half come back at once, half far beyond t2: expiring the long ones frees slots for the
    # short ones (scored in the finite tier; see tests/policy/test_retention_control.py).
    mixed = [0.01 * t2] * 50 + [20 * t2] * 50
    assert choose_regime(mixed, lam, DEFAULT_PRICE, c2, w_ref).regime == "ttl"


def test_price_vector_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="beta2"):
        PriceVector(alpha1=0.1, beta2=-1.0, beta3=1.0)


def test_lambda_estimator_tracks_rate() -> None:
    est = LambdaEstimator(window_s=100.0, min_span_s=10.0)
    for i in range(50):
        est.observe(float(i * 2))  # one suspension every 2 s
    assert est.rate(100.0) == pytest.approx(0.5, rel=0.05)
    assert est.rate(1000.0) == 0.0
    assert LambdaEstimator.from_state(est.to_state()).rate(100.0) == est.rate(100.0)


def test_lifecycle_decisions() -> None:
    gp = GapPredictor()
    done = on_response(
        10.0, stop_reason="end_turn", last_turn=True, hinted_gap_s=None, predictor=gp
    )
    assert done.state == "finished" and done.reclaim
    idle = on_response(
        10.0, stop_reason="tool_use", last_turn=False, hinted_gap_s=None, predictor=gp
    )
    assert idle.state == "idle" and idle.wakeup_at == pytest.approx(19.0)
    assert idle.reason == "predicted_tool"
    settings = RetentionSettings(price=DEFAULT_PRICE, host_slots=10.0, w_ref_s=100.0)
    calm = on_suspend(0.0, expected_wait_s=600.0, retention=settings, estimated_lambda=0.01)
    busy = on_suspend(0.0, expected_wait_s=600.0, retention=settings, estimated_lambda=1.0)
    assert calm.host_ttl_s is None and busy.host_ttl_s is not None and busy.host_ttl_s > 0


def test_a_declared_retention_caps_the_hold_only_under_congestion() -> None:
    """A session's ``cache_control`` TTL: held no longer than the client asked while a slot
    has a price; ignored while holding is free; never lengthens the controller's hold."""
    settings = RetentionSettings(price=DEFAULT_PRICE, host_slots=10.0, w_ref_s=100.0)
    busy_lam = 0.2  # 2 x lambda_crit: t2 = 1.89 / 1.91 x W_ref = 98.95 s
    t2 = host_ttl_seconds(busy_lam, DEFAULT_PRICE, 10.0, 100.0)
    assert t2 == pytest.approx(98.95, rel=1e-3)

    def suspend(lam: float, declared: float | None, branch: str | None = "ttl"):
        return on_suspend(
            0.0, expected_wait_s=None, retention=settings, estimated_lambda=lam,
            branch=branch, declared_retention_s=declared,  # type: ignore[arg-type]
        )  # fmt: skip

    short = suspend(busy_lam, 30.0)
    assert short.host_ttl_s == 30.0 and short.reason == "client_retention"
    longer = suspend(busy_lam, 3600.0)  # longer than t2: t2 stands
    assert longer.host_ttl_s == pytest.approx(t2) and longer.reason == "host_ttl"
    kept = suspend(busy_lam, 300.0, "retain")  # the retain branch is capped too
    assert kept.host_ttl_s == 300.0 and kept.reason == "client_retention"
    assert suspend(busy_lam, None, "retain").host_ttl_s is None
    calm = suspend(0.05, 30.0)  # uncongested: a held slot costs nothing, keep it
    assert calm.host_ttl_s is None and calm.reason == "host_retain"
    no_branch = suspend(busy_lam, 10.0, None)
    assert no_branch.host_ttl_s == 10.0 and no_branch.reason == "client_retention"
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="declared retention"):
            bound_by_declared_retention(t2, bad, busy_lam, 10.0, 100.0)
