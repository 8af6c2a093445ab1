"""The suspension decision with the tenant's rent clock (pure core: lifecycle.on_suspend)."""

from __future__ import annotations

from typing import Any

import pytest

from tenure.service.policy import lifecycle
from tenure.service.policy.platforms import PLATFORMS
from tenure.service.policy.rent import RentClock, rent_budget
from tenure.service.policy.retention import alpha2, lambda_crit

PRICE = PLATFORMS["h100-nvl"].price
SETTINGS = lifecycle.RetentionSettings(price=PRICE, host_slots=425, w_ref_s=1800.0)
CRIT = lambda_crit(425, 1800.0)


def _clock(lam: float, at: float = 0.0, accrued: float = 7.0) -> RentClock:
    return RentClock(accrued, at, alpha2(lam, 425, 1800.0, PRICE.beta3))


def _suspend(now: float, **kw: Any) -> lifecycle.LifecycleDecision:
    return lifecycle.on_suspend(
        now, expected_wait_s=None, retention=SETTINGS, estimated_lambda=2 * CRIT, **kw
    )


def test_the_ttl_branch_gets_a_limit_whose_timer_at_this_price_is_t2() -> None:
    clock = _clock(2 * CRIT)
    decision = _suspend(100.0, branch="ttl", rent=clock)
    assert decision.reason == "host_ttl" and decision.host_ttl_s is not None
    assert decision.host_rent_limit == pytest.approx(clock.value(100.0) + rent_budget(PRICE))
    assert decision.host_rent_limit is not None
    assert clock.remaining(decision.host_rent_limit, 100.0) == pytest.approx(decision.host_ttl_s)
    assert clock.value(100.0) == pytest.approx(7.0 + 100.0 * clock.rate)  # the clock unchanged


def test_retain_a_binding_declared_retention_and_no_clock_give_no_limit() -> None:
    clock = _clock(2 * CRIT)
    assert _suspend(5.0, branch="retain", rent=clock).host_rent_limit is None
    bound = _suspend(5.0, branch="ttl", rent=clock, declared_retention_s=300.0)
    assert bound.reason == "client_retention" and bound.host_ttl_s == 300.0
    assert bound.host_rent_limit is None  # a fixed timer: the client asked for no longer
    assert _suspend(5.0, branch="ttl").host_rent_limit is None  # no clock: as before


def test_uncongested_the_ttl_branch_holds_but_keeps_a_limit_for_a_price_rise() -> None:
    clock = _clock(0.5 * CRIT)
    decision = lifecycle.on_suspend(
        10.0, expected_wait_s=None, retention=SETTINGS, estimated_lambda=0.5 * CRIT,
        branch="ttl", rent=clock,
    )  # fmt: skip
    assert decision.host_ttl_s is None and decision.reason == "host_retain"
    assert decision.host_rent_limit == pytest.approx(7.0 + rent_budget(PRICE))
