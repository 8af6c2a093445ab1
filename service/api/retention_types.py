"""The sidecar's retention controller's settings and one tenant's view of it (see
:mod:`service.api.retention`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from service.metrics_retention import BRANCHES
from service.policy.retention_costs import Branch

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
        return view
