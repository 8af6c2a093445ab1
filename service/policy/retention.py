"""Retention of suspended sessions: the load-indexed host TTL (seed 002, section 3).

A session waiting on a human approval is offloaded to host at suspension (the HBM/DRAM
break-even ``t1 = beta2 / alpha1`` is about a second), then its host copy is kept for

    t2(lambda) = (beta3 - beta2) / alpha2(lambda),
    alpha2(lambda) = max(0, lambda - lambda_crit) * beta3 / C2,   lambda_crit = C2 / W_ref,

i.e. forever while the offered suspension rate ``lambda`` stays under what ``C2`` host slots
absorb at the reference residence ``W_ref`` (Little's law), and ever shorter above it. A
regime-aware controller picks host-retain or the TTL branch from calibration wait samples by
their opportunity cost in the finite host tier (:mod:`tenure.service.policy.host_loss`). The paper
used the configured load; :class:`LambdaEstimator` (and the other estimators of
:mod:`tenure.service.policy.rate`) estimate it online, and
:mod:`tenure.service.policy.retention_control` re-chooses the branch while load and waits change.
Costs are in GPU-seconds, times in seconds, rates per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tenure.service.policy.rate import SlidingWindowRate

__all__ = [
    "DEFAULT_PRICE",
    "LambdaEstimator",
    "PriceVector",
    "alpha2",
    "bound_by_declared_retention",
    "hold_cost",
    "host_ttl_seconds",
    "lambda_crit",
]


@dataclass(frozen=True, slots=True)
class PriceVector:
    """Per-platform opportunity costs: HBM holding (GPU-s/s), host resume and recompute (GPU-s)."""

    alpha1: float
    beta2: float
    beta3: float

    def __post_init__(self) -> None:
        for name in ("alpha1", "beta2", "beta3"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.alpha1 == 0:
            raise ValueError("alpha1 must be > 0")
        if self.beta3 < self.beta2:
            raise ValueError("beta3 (recompute) must be >= beta2 (host resume)")

    @property
    def t1(self) -> float:
        """HBM -> host break-even: offload a suspended context after this long."""
        return self.beta2 / self.alpha1

    @property
    def t_star(self) -> float:
        """HBM -> discard break-even."""
        return self.beta3 / self.alpha1


#: Llama-3.1-70B bf16 TP4 on 4x H100 NVL, seed 002 Appendix B: alpha1 = 4 x 3000/680768,
#: beta2 = 0.02 GPU-s scheduling allowance, beta3 = 0.479 s suffix re-prefill x 4 ranks.
DEFAULT_PRICE = PriceVector(alpha1=0.0176, beta2=0.02, beta3=1.91)


#: The sliding-window estimator under its original name (the sidecar's runtime uses it).
LambdaEstimator = SlidingWindowRate


def hold_cost(alpha: float, beta: float, held_s: float) -> float:
    """Equation 1: ``C_j(l) = alpha_j * l + beta_j`` for ``l`` seconds in state ``j``."""
    return alpha * held_s + beta


def _positive(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def lambda_crit(c2: float, w_ref_s: float) -> float:
    """Suspension rate at which ``c2`` host slots saturate at residence ``w_ref_s``."""
    _positive("c2", c2)
    _positive("w_ref_s", w_ref_s)
    return c2 / w_ref_s


def alpha2(lam: float, c2: float, w_ref_s: float, beta3: float) -> float:
    """Mean-field host holding price under congestion (GPU-s per second held)."""
    return max(0.0, lam - lambda_crit(c2, w_ref_s)) * beta3 / c2


def host_ttl_seconds(lam: float, price: PriceVector, c2: float, w_ref_s: float) -> float | None:
    """``t2(lambda)``: how long to keep a suspended host copy; ``None`` = indefinitely."""
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lambda must be a finite rate >= 0, got {lam!r}")
    price_2 = alpha2(lam, c2, w_ref_s, price.beta3)
    if price_2 <= 0:
        return None
    return (price.beta3 - price.beta2) / price_2


def bound_by_declared_retention(
    ttl_s: float | None,
    declared_s: float | None,
    lam: float,
    c2: float,
    w_ref_s: float,
) -> float | None:
    """The host TTL of one suspension whose client declared how long it wants its prefix kept.

    A client-declared retention (a ``cache_control`` TTL on ``/v1/messages``) says the
    client does not count on its prefix being kept longer. While the host tier is congested
    (``lambda > lambda_crit``: a held slot has the price ``alpha2 > 0``), holding that
    session's copy past it only takes a slot another suspension could use, so the TTL is the
    shorter of the two. While uncongested, holding is free (``alpha2 = 0``) and a late resume
    may still hit, so the declaration changes nothing. It only ever shortens a hold: a hint
    cannot make a session keep a slot longer than its tenant's controller would.
    """
    if declared_s is None:
        return ttl_s
    if not (math.isfinite(declared_s) and declared_s >= 0):
        raise ValueError(f"declared retention must be a finite number >= 0, got {declared_s!r}")
    if alpha2(lam, c2, w_ref_s, 1.0) <= 0:
        return ttl_s
    return declared_s if ttl_s is None else min(ttl_s, declared_s)
