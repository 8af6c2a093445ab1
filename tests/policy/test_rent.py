"""The re-priced host timer: the rent clock, the controller's limits, and the replay's expiries."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tenure.service.policy.platforms import PLATFORMS
from tenure.service.policy.rate import rate_estimator
from tenure.service.policy.rent import RentClock, rent_budget
from tenure.service.policy.retention import alpha2
from tenure.service.policy.retention_control import (
    OneShotController,
    OnlineController,
    OnlineSettings,
)
from tenure.service.policy.retention_costs import RetentionModel
from tenure.service.replay.ttl_families import synthetic_family
from tenure.service.replay.ttl_policies import OneShotPolicy
from tenure.service.replay.ttl_sim import (
    RentLimit,
    RentTrace,
    poisson_arrivals,
    replay_policy,
    replay_timers,
)

PRICE = PLATFORMS["h100-nvl"].price
MODEL = RetentionModel(PRICE, 425, 1800.0)
CRIT = MODEL.lambda_crit
BUDGET = rent_budget(PRICE)


def _price_at(lam: float) -> float:
    return alpha2(lam, MODEL.c2, MODEL.w_ref_s, PRICE.beta3)


@pytest.mark.parametrize("load", [1.5, 2.0, 3.0])
def test_a_constant_price_expires_a_copy_exactly_at_t2(load: float) -> None:
    clock = RentClock()
    clock.reprice(100.0, _price_at(load * CRIT))
    limit = clock.limit_for(250.0, BUDGET)
    t2 = MODEL.t2(load * CRIT)
    assert t2 is not None
    assert clock.expires_at(limit) == pytest.approx(250.0 + t2)
    assert clock.remaining(limit, 250.0) == pytest.approx(t2)


def test_a_price_rise_shortens_a_held_copy_and_a_fall_lengthens_it() -> None:
    rate = _price_at(2 * CRIT)
    t2 = MODEL.t2(2 * CRIT)
    assert t2 is not None
    for factor, shorter in ((2.0, True), (0.5, False)):
        clock = RentClock()
        clock.reprice(0.0, rate)
        limit = clock.limit_for(0.0, BUDGET)
        clock.reprice(t2 / 2, rate * factor)  # half the budget paid at the old price
        expiry = clock.expires_at(limit)
        assert expiry is not None
        assert expiry == pytest.approx(t2 / 2 + (t2 / 2) / factor)
        assert (expiry < t2) is shorter


def test_no_congestion_holds_until_the_price_rises_and_the_past_is_kept() -> None:
    clock = RentClock()
    clock.reprice(0.0, 0.0)
    limit = clock.limit_for(0.0, BUDGET)
    assert clock.expires_at(limit) is None and clock.remaining(limit, 5.0) is None
    clock.reprice(1000.0, 0.01)
    assert clock.expires_at(limit) == pytest.approx(1000.0 + BUDGET / 0.01)
    paid = clock.value(2000.0)
    clock.reprice(1500.0, 1.0)  # a late event: it cannot rewrite what was charged before
    assert clock.value(2000.0) >= paid - 1e-12
    assert clock.remaining(0.0, 10_000.0) == 0.0  # a limit already reached is due now


def test_the_clock_round_trips_and_refuses_bad_values() -> None:
    clock = RentClock()
    clock.reprice(3.0, 0.25)
    again = RentClock.from_state(clock.to_state())
    assert again == clock and again.value(10.0) == clock.value(10.0)
    assert RentClock.from_state(None) == RentClock()
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="rate"):
            clock.reprice(4.0, bad)
    with pytest.raises(ValueError, match="accrued"):
        RentClock(accrued=-1.0)
    with pytest.raises(ValueError, match="budget"):
        clock.limit_for(5.0, math.nan)


def test_the_online_controller_reprices_and_gives_limits_on_the_ttl_branch_only() -> None:
    settings = OnlineSettings(pinned_lambda=2 * CRIT, initial_branch="ttl")
    controller = OnlineController(MODEL, settings)
    controller.observe_suspension(10.0)
    limit = controller.rent_limit(10.0)
    assert limit is not None
    expiry = controller.rent.expires_at(limit)
    t2 = controller.host_ttl(10.0)
    assert expiry is not None and t2 is not None
    assert expiry - 10.0 == pytest.approx(t2)
    again = OnlineController.from_state(MODEL, settings, controller.to_state())
    assert again.rent == controller.rent
    controller.branch = "retain"
    assert controller.rent_limit(20.0) is None
    with pytest.raises(ValueError, match="timer"):
        OnlineSettings(timer="sometimes")  # type: ignore[arg-type]


def test_the_trace_finds_the_time_the_clock_reached_a_limit() -> None:
    clock, trace = RentClock(), RentTrace.empty()
    for at, rate in ((0.0, 0.0), (10.0, 1.0), (20.0, 0.5), (30.0, 0.0)):
        clock.reprice(at, rate)
        trace.record(clock)
    assert trace.accrued == [0.0, 0.0, 10.0, 15.0]
    assert trace.expiry(5.0) == pytest.approx(15.0)
    assert trace.expiry(12.5) == pytest.approx(25.0)
    assert trace.expiry(15.0) == pytest.approx(30.0)
    assert trace.expiry(16.0) == math.inf  # the price fell to zero before the limit
    assert trace.expiry(0.0) == 0.0


def test_repriced_timers_at_a_constant_price_replay_as_the_one_shot_ones() -> None:
    """A pinned rate: the re-priced controller is the seed's, copy for copy."""
    rng = np.random.default_rng(7)
    lam = 2 * CRIT
    arrivals = poisson_arrivals(1500, lam, rng)
    waits = synthetic_family("mixture", 1800.0).sample(1500, rng, "heldout")
    controller = OneShotController(MODEL, lam=lam, calibration_waits_s=[1.0, 7200.0] * 50)
    controller.branch = "ttl"

    class Pinned:
        kind = "pinned"

        def observe(self, now: float) -> None:
            return None

        def evidence(self, now: float) -> tuple[float, float]:
            return 1e12 * lam, 1e12  # a rate known exactly (zero standard error)

    policy = OneShotPolicy(controller, Pinned(), 0.0, repriced=True)  # type: ignore[arg-type]
    repriced = replay_policy(arrivals, waits, policy, MODEL.slots, PRICE)
    t2 = MODEL.t2(lam)
    assert t2 is not None
    fixed = replay_timers(arrivals, waits, np.full(1500, t2), MODEL.slots, PRICE)
    np.testing.assert_allclose(repriced.ttls, fixed.ttls, rtol=1e-9)
    assert repriced.mean_cost == pytest.approx(fixed.mean_cost)


def test_a_cold_estimate_costs_less_repriced_than_fixed_at_suspension() -> None:
    """Issue 13's est-lam cell (mixture, 2 x lambda_crit): the first suspensions' one-shot
    timers carry the cold estimator's error for their whole hold; re-priced ones do not."""
    lam = 2 * CRIT
    controller = OneShotController(MODEL, lam=lam, calibration_waits_s=[1.0, 7200.0] * 50)
    controller.branch = "ttl"
    t2 = MODEL.t2(lam)
    assert t2 is not None
    gaps = {"oneshot": [], "repriced": []}  # type: dict[str, list[float]]
    for rep in range(6):
        rng = np.random.default_rng([11, rep])
        arrivals = poisson_arrivals(4000, lam, rng)
        waits = synthetic_family("mixture", 1800.0).sample(4000, rng, "heldout")
        base = replay_timers(arrivals, waits, np.full(4000, t2), MODEL.slots, PRICE).mean_cost
        for name, repriced in (("oneshot", False), ("repriced", True)):
            policy = OneShotPolicy(controller, rate_estimator("changepoint:300"), 1.0, repriced)
            cost = replay_policy(arrivals, waits, policy, MODEL.slots, PRICE).mean_cost
            gaps[name].append((cost - base) / base)
    assert np.mean(gaps["repriced"]) < np.mean(gaps["oneshot"]) - 0.005
    assert isinstance(RentLimit(1.0).limit, float)
