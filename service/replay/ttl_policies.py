"""The core's retention controllers as replay policies (the sidecar calls the same objects)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tenure.service.policy.rate import RateEstimator, rate_lower_bound
from tenure.service.policy.rent import RentClock
from tenure.service.policy.retention import alpha2
from tenure.service.policy.retention_control import (
    CalibratedTimer,
    OneShotController,
    OnlineController,
    RetentionDecision,
)
from tenure.service.policy.retention_costs import RetentionModel
from tenure.service.policy.retention_rule import scale_budget
from tenure.service.replay.ttl_sim import RentLimit, RentTrace

__all__ = ["LoadIndexedTimer", "OneShotPolicy", "OnlinePolicy"]


@dataclass
class OneShotPolicy:
    """A one-shot controller (the seed's, or the timer rule calibrated once); with
    ``estimator``, lambda is estimated from the suspensions.

    ``repriced`` (with an estimator): a copy's timer is the rent clock's (re-priced at each
    suspension, :mod:`tenure.service.policy.rent`), as Tenure's sidecar does; without, it is
    ``t2`` at the estimate of its own suspension, fixed (the one-shot timer).
    """

    controller: OneShotController | CalibratedTimer
    estimator: RateEstimator | None = None
    #: Price with the estimate this many standard errors low (as the online controller).
    lambda_z: float = 0.0
    repriced: bool = False
    lam_errors: list[tuple[float, float]] = field(default_factory=list)
    rent: RentClock = field(default_factory=RentClock)
    rent_trace: RentTrace = field(default_factory=RentTrace.empty)

    def on_suspend(self, now: float) -> float | RentLimit | None:
        if self.estimator is None:
            return self.controller.host_ttl()
        self.estimator.observe(now)
        lam = rate_lower_bound(self.estimator, now, self.lambda_z)
        self.lam_errors.append((now, lam))
        if not self.repriced:
            return self.controller.host_ttl(lam)
        m = self.controller.model
        self.rent.reprice(now, alpha2(lam, m.c2, m.w_ref_s, m.price.beta3))
        self.rent_trace.record(self.rent)
        budget = scale_budget(m, self.controller.scale)
        if budget is None:
            return None
        return RentLimit(self.rent.limit_for(now, budget))

    def on_resume(self, now: float, wait_s: float) -> None:
        return None


@dataclass
class OnlinePolicy:
    """Tenure's online controller, re-choosing its branch when a period is due; its timers
    are as its settings say (``timer``: re-priced by the rent clock, or one-shot)."""

    controller: OnlineController
    decisions: list[RetentionDecision] = field(default_factory=list)
    lam_trace: list[tuple[float, float]] = field(default_factory=list)
    rent_trace: RentTrace = field(default_factory=RentTrace.empty)

    def on_suspend(self, now: float) -> float | RentLimit | None:
        self.controller.observe_suspension(now)
        if self.controller.due(now):
            self.decisions.append(self.controller.decide(now))
        estimator = self.controller.estimator
        assert estimator is not None
        # The estimate itself (what tracking error is about), not the bound t2 is priced with.
        self.lam_trace.append((now, estimator.rate(now)))
        if self.controller.settings.timer == "oneshot":
            return self.controller.host_ttl(now)
        self.rent_trace.record(self.controller.rent)
        limit = self.controller.rent_limit(now)
        return None if limit is None else RentLimit(limit)

    def on_resume(self, now: float, wait_s: float) -> None:
        self.controller.observe_resume(now, wait_s)


@dataclass
class LoadIndexedTimer:
    """``cpu_ttl(lambda)`` with lambda given by ``rate_at`` (the configured or true load)."""

    model: RetentionModel
    rate_at: Callable[[float], float]

    def on_suspend(self, now: float) -> float | None:
        return self.model.t2(self.rate_at(now))

    def on_resume(self, now: float, wait_s: float) -> None:
        return None
