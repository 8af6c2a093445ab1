"""Prometheus metrics of the online host-retention controller and of resume outcomes.

Labels are bounded: ``tenant`` is a configured tenant name (at most 64 distinct, through a
:class:`~tenure.service.metrics.LabelBudget`), ``branch`` is ``retain``/``ttl``, ``outcome`` is
``hbm``/``host``/``recomputed``, ``source`` is ``hbm``/``host``/``computed``; anything else an
adapter sends is counted under ``other``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["BRANCHES", "OUTCOMES", "RetentionMetrics", "bounded"]

BRANCHES = ("retain", "ttl")
OUTCOMES = ("hbm", "host", "recomputed")
_COST_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 100, 300, 1000)


def bounded(value: str, allowed: tuple[str, ...]) -> str:
    return value if value in allowed else "other"


class RetentionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.lambda_estimate = Gauge(
            "tenure_retention_lambda_estimate_per_second",
            "Suspension rate estimated from the tenant's suspension stream",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.lambda_in_use = Gauge(
            "tenure_retention_lambda_in_use_per_second",
            "Suspension rate the host TTL is priced with (pinned, or the estimate's lower bound)",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.lambda_pinned = Gauge(
            "tenure_retention_lambda_pinned",
            "1 while an SRE pins lambda (lambda_mode fixed), else 0", ["tenant"], registry=r,
        )  # fmt: skip
        self.lambda_crit = Gauge(
            "tenure_retention_lambda_crit_per_second",
            "C2 / W_ref: the suspension rate above which the tenant's host slots saturate",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.host_ttl = Gauge(
            "tenure_retention_host_ttl_seconds",
            "t2 given to a suspension now (-1 = retained until resume)", ["tenant"], registry=r,
        )  # fmt: skip
        self.rent_rate = Gauge(
            "tenure_retention_rent_rate_gpu_seconds_per_second",
            "Congestion rent a held host copy pays now: alpha2 at the lambda in use (GPU-s per "
            "held second; 0 = uncongested, held copies wait until resume)",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.rent_accrued = Gauge(
            "tenure_retention_rent_accrued_gpu_seconds",
            "The tenant's rent clock: rent one host slot has accrued (a held copy expires when "
            "it reaches the copy's limit, beta3 - beta2 above its value at suspension)",
            ["tenant"], registry=r,
        )  # fmt: skip
        self.branch = Gauge(
            "tenure_retention_branch",
            "1 for the branch in use (retain or ttl), 0 for the other",
            ["tenant", "branch"], registry=r,
        )  # fmt: skip
        self.suspended = Gauge(
            "tenure_retention_suspended_sessions",
            "Suspensions in the controller's window not resumed yet", ["tenant"], registry=r,
        )  # fmt: skip
        self.host_slots = Gauge(
            "tenure_retention_host_slots",
            "C2: host slots the tenant's controller prices with", ["tenant"], registry=r,
        )  # fmt: skip
        self.observed_waits = Gauge(
            "tenure_retention_observed_waits",
            "Suspend -> resume waits in the controller's window", ["tenant"], registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            "tenure_retention_decisions",
            "Branch re-choices, by whether the branch changed", ["tenant", "changed"], registry=r,
        )  # fmt: skip
        self.lease_held = Gauge(
            "tenure_retention_lease_held",
            "1 on the replica that re-chooses branches (holds the lease)", registry=r,
        )  # fmt: skip
        self.resumes = Counter(
            "tenure_resumes",
            "Resumed requests by the branch they were suspended under and where their prompt "
            "was served from (hbm, host, recomputed), as the adapter reports",
            ["branch", "outcome"], registry=r,
        )  # fmt: skip
        self.resume_tokens = Counter(
            "tenure_resume_prompt_tokens",
            "Prompt tokens of resumed requests by source (hbm, host, computed)",
            ["source"], registry=r,
        )  # fmt: skip
        self.resume_cost = Histogram(
            "tenure_resume_opportunity_cost_gpu_seconds",
            "GPU opportunity cost of one suspended-and-resumed request (seed 002, eq. 1): "
            "alpha1 x wait (hbm), alpha2 x held + beta2 (host), alpha2 x held + beta3 "
            "(recomputed)",
            ["branch", "outcome"], buckets=_COST_BUCKETS, registry=r,
        )  # fmt: skip
