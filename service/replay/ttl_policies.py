"""The core's retention controllers as replay policies (the sidecar calls the same objects)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from service.policy.rate import RateEstimator, rate_lower_bound
from service.policy.retention_control import OneShotController, OnlineController, RetentionDecision
from service.policy.retention_costs import RetentionModel

__all__ = ["LoadIndexedTimer", "OneShotPolicy", "OnlinePolicy"]


@dataclass
class OneShotPolicy:
    """The seed's controller; with ``estimator``, ``t2`` follows the estimated lambda."""

    controller: OneShotController
    estimator: RateEstimator | None = None
    #: Price with the estimate this many standard errors low (as the online controller).
    lambda_z: float = 0.0
    lam_errors: list[tuple[float, float]] = field(default_factory=list)

    def on_suspend(self, now: float) -> float | None:
        if self.estimator is None:
            return self.controller.host_ttl()
        self.estimator.observe(now)
        lam = rate_lower_bound(self.estimator, now, self.lambda_z)
        self.lam_errors.append((now, lam))
        return self.controller.host_ttl(lam)

    def on_resume(self, now: float, wait_s: float) -> None:
        return None


@dataclass
class OnlinePolicy:
    """Tenure's online controller, re-choosing its branch when a period is due."""

    controller: OnlineController
    decisions: list[RetentionDecision] = field(default_factory=list)
    lam_trace: list[tuple[float, float]] = field(default_factory=list)

    def on_suspend(self, now: float) -> float | None:
        self.controller.observe_suspension(now)
        if self.controller.due(now):
            self.decisions.append(self.controller.decide(now))
        estimator = self.controller.estimator
        assert estimator is not None
        # The estimate itself (what tracking error is about), not the bound t2 is priced with.
        self.lam_trace.append((now, estimator.rate(now)))
        return self.controller.host_ttl(now)

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
