"""The congestion rent of a held host copy: the seed's timer, re-priced while lambda moves.

Seed 002 derives the host timer as a break-even: a suspended copy held on host pays the
congestion price ``alpha2(lambda)`` per second (the slot it keeps from another suspension),
and dropping it costs the recompute it then needs, ``beta3 - beta2`` more than a host resume.
So ``t2 = (beta3 - beta2) / alpha2``: hold until the rent paid equals the price of giving up.
That is the ski-rental rule with a constant rent. The seed fixes ``alpha2`` at suspension (a
one-shot timer at the configured lambda). When lambda is estimated online, the estimate at
suspension is the least informed one the copy will ever see (a cold estimator is 5-25% off
for its first few hundred suspensions, and ``t2`` moves twice as much as lambda at
2 x lambda_crit), and when the load really changes the price a held copy pays changes with it.

:class:`RentClock` keeps the rent one host slot has accrued, ``R(t) = integral of alpha2``,
piecewise linear between re-pricings. A copy suspended at ``s`` gets the limit
``R(s) + (beta3 - beta2)`` and expires when the clock reaches it: at a constant price exactly
``s + t2(lambda)`` (so the configured-lambda controller is the seed's, unchanged), and otherwise
at the break-even of the rent actually charged while it was held. Pure: time is an argument.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenure.service.policy.retention import PriceVector

__all__ = ["RentClock", "rent_budget"]


def rent_budget(price: PriceVector) -> float:
    """What a held copy may pay in rent before dropping it is cheaper: ``beta3 - beta2``."""
    return price.beta3 - price.beta2


def _finite(name: str, value: float, *, lower: float | None = None) -> float:
    if not math.isfinite(value) or (lower is not None and value < lower):
        bound = "" if lower is None else f" >= {lower:g}"
        raise ValueError(f"{name} must be a finite number{bound}, got {value!r}")
    return float(value)


@dataclass(slots=True)
class RentClock:
    """Accrued congestion rent of one host slot (GPU-s), priced at ``rate`` since ``at``."""

    accrued: float = 0.0
    at: float | None = None
    #: GPU-s per second held, in force since ``at`` (``alpha2`` at the lambda then in use).
    rate: float = 0.0

    def __post_init__(self) -> None:
        _finite("accrued", self.accrued, lower=0.0)
        _finite("rate", self.rate, lower=0.0)
        if self.at is not None:
            _finite("at", self.at)

    def value(self, now: float) -> float:
        """``R(now)``; a time before the last re-pricing reads the value then (never less)."""
        if self.at is None:
            return self.accrued
        return self.accrued + self.rate * max(0.0, now - self.at)

    def reprice(self, now: float, rate: float) -> None:
        """Charge ``rate`` from ``now`` on (what was accrued up to ``now`` is kept)."""
        rate = _finite("rate", rate, lower=0.0)
        now = _finite("now", now)
        if self.at is not None and now < self.at:
            now = self.at  # a late event never rewrites the past
        self.accrued = self.value(now)
        self.at = now
        self.rate = rate

    def limit_for(self, now: float, budget: float) -> float:
        """The clock value at which a copy suspended at ``now`` with ``budget`` expires."""
        return self.value(now) + _finite("budget", budget, lower=0.0)

    def expires_at(self, limit: float) -> float | None:
        """When the clock reaches ``limit`` at the current price (``None``: it does not, the
        price is zero). A limit already reached expires at the last re-pricing."""
        if limit <= self.accrued:
            return self.at if self.at is not None else -math.inf
        if self.rate <= 0 or self.at is None:
            return None
        return self.at + (limit - self.accrued) / self.rate

    def remaining(self, limit: float, now: float) -> float | None:
        """Seconds from ``now`` until a copy with ``limit`` expires (0: due; ``None``: held
        until resume unless the price rises)."""
        at = self.expires_at(limit)
        return None if at is None else max(0.0, at - now)

    def to_state(self) -> dict[str, Any]:
        return {"accrued": self.accrued, "at": self.at, "rate": self.rate}

    @classmethod
    def from_state(cls, state: Mapping[str, Any] | None) -> RentClock:
        if not state:
            return cls()
        at = state.get("at")
        return cls(
            float(state.get("accrued", 0.0)),
            None if at is None else float(at),
            float(state.get("rate", 0.0)),
        )
