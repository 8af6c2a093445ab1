"""The sidecar's retention controller's settings and one tenant's view of it (see
:mod:`tenure.service.api.retention.controller`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from tenure.service.metrics_retention import BRANCHES
from tenure.service.policy.rent import RentClock
from tenure.service.policy.retention_costs import Branch

__all__ = ["INITIAL_BRANCH", "RetentionKnobs", "TenantRetention"]

#: Where a sidecar's controller starts (see the module docstring).
INITIAL_BRANCH: Branch = "ttl"


@dataclass(frozen=True, slots=True)
class RetentionKnobs:
    """The controller's settings (``TENURE_RETENTION_*``)."""

    period_s: float = 900.0
    min_samples: int = 200
    margin: float = 0.05
    estimator: str = "changepoint:300"
    window: int = 2000
    lease_s: float = 30.0
    #: ``branch`` (the seed's two branches) or ``timer`` (issue 26's rent-budget scale).
    rule: Literal["branch", "timer"] = "branch"


@dataclass(slots=True)
class TenantRetention:
    """One tenant's controller view, as the lease holder last wrote it."""

    branch: Branch = INITIAL_BRANCH
    #: The estimator's rate and the lower bound priced with (suspensions/s).
    lambda_estimate: float = 0.0
    lambda_lower: float = 0.0
    observed_waits: int = 0
    pending: int = 0
    decided_at: float | None = None
    decisions: int = 0
    switches: int = 0
    reason: str = "no decision yet"
    updated_at: float | None = None
    #: The tenant's rent clock (:class:`~tenure.service.policy.rent.RentClock`): accrued GPU-s at
    #: ``rent_at`` (Unix s) and the rate charged since. Persistent and monotone: the holder
    #: loads it from this doc and only moves it forward.
    rent_accrued: float = 0.0
    rent_at: float | None = None
    rent_rate: float = 0.0
    #: The retention rule's rent-budget scale (multiple of ``t2``) on the ttl branch; its
    #: last choice (:meth:`~tenure.service.policy.retention_rule.TimerChoice.to_dict` with the
    #: sample it was chosen on), ``None`` before the first scored decision.
    scale: float | None = 1.0
    choice: dict[str, Any] | None = None

    def rent(self) -> RentClock:
        return RentClock(self.rent_accrued, self.rent_at, self.rent_rate)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TenantRetention:
        view = cls()
        branch = doc.get("branch")
        if branch in BRANCHES:
            view.branch = branch
        for name in ("lambda_estimate", "lambda_lower"):
            value = doc.get(name)
            if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
                setattr(view, name, float(value))
        for name in ("observed_waits", "pending", "decisions", "switches"):
            value = doc.get(name)
            if isinstance(value, int) and value >= 0:
                setattr(view, name, value)
        for name in ("decided_at", "updated_at"):
            value = doc.get(name)
            if isinstance(value, int | float) and math.isfinite(value):
                setattr(view, name, float(value))
        if isinstance(doc.get("reason"), str):
            view.reason = doc["reason"]
        scale = doc.get("scale", 1.0)
        if view.branch == "retain":
            view.scale = None
        elif _number(scale) and math.isfinite(scale) and scale > 0:
            view.scale = float(scale)
        if isinstance(doc.get("choice"), dict):
            view.choice = doc["choice"]
        view._load_rent(doc)
        return view

    def _load_rent(self, doc: dict[str, Any]) -> None:
        """The clock as stored, or a fresh one if it is missing or not a valid clock (negative,
        non-finite, not numbers). A fresh clock reads lower than the lost one, so a copy held
        with a limit on the old clock waits longer, never shorter: the safe direction."""
        accrued, at, rate = (doc.get(n) for n in ("rent_accrued", "rent_at", "rent_rate"))
        if not (_number(accrued) and _number(rate) and (at is None or _number(at))):
            return
        try:
            clock = RentClock.from_state({"accrued": accrued, "at": at, "rate": rate})
        except ValueError:
            return
        self.rent_accrued, self.rent_at, self.rent_rate = clock.accrued, clock.at, clock.rate


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
