"""Retention of suspended sessions: the load-indexed host TTL (seed 002, section 3).

A session waiting on a human approval is offloaded to host at suspension (the HBM/DRAM
break-even ``t1 = beta2 / alpha1`` is about a second), then its host copy is kept for

    t2(lambda) = (beta3 - beta2) / alpha2(lambda),
    alpha2(lambda) = max(0, lambda - lambda_crit) * beta3 / C2,   lambda_crit = C2 / W_ref,

i.e. forever while the offered suspension rate ``lambda`` stays under what ``C2`` host slots
absorb at the reference residence ``W_ref`` (Little's law), and ever shorter above it. A
regime-aware controller picks host-retain or the TTL branch from calibration wait samples by
their total opportunity cost. The paper used the configured load; :class:`LambdaEstimator`
estimates it online. Costs are in GPU-seconds, times in seconds, rates per second.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "DEFAULT_PRICE",
    "LambdaEstimator",
    "PriceVector",
    "RegimeChoice",
    "alpha2",
    "choose_regime",
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


def lambda_crit(c2: float, w_ref_s: float) -> float:
    """Suspension rate at which ``c2`` host slots saturate at residence ``w_ref_s``."""
    if c2 <= 0 or w_ref_s <= 0:
        raise ValueError("c2 and w_ref_s must be > 0")
    return c2 / w_ref_s


def alpha2(lam: float, c2: float, w_ref_s: float, beta3: float) -> float:
    """Mean-field host holding price under congestion (GPU-s per second held)."""
    return max(0.0, lam - lambda_crit(c2, w_ref_s)) * beta3 / c2


def host_ttl_seconds(lam: float, price: PriceVector, c2: float, w_ref_s: float) -> float | None:
    """``t2(lambda)``: how long to keep a suspended host copy; ``None`` = indefinitely."""
    if lam < 0 or not math.isfinite(lam):
        raise ValueError(f"lambda must be a finite rate >= 0, got {lam!r}")
    price_2 = alpha2(lam, c2, w_ref_s, price.beta3)
    if price_2 <= 0:
        return None
    return (price.beta3 - price.beta2) / price_2


@dataclass(frozen=True, slots=True)
class RegimeChoice:
    regime: Literal["retain", "ttl"]
    host_ttl_s: float | None
    cost_retain: float
    cost_ttl: float
    samples: int


def choose_regime(
    waits_s: Iterable[float], lam: float, price: PriceVector, c2: float, w_ref_s: float
) -> RegimeChoice:
    """Replay calibration waits under host-retain and ``cpu_ttl(lambda)``; keep the cheaper.

    Retain pays ``alpha2 * w + beta2`` per wait. The TTL branch pays the same while the wait
    ends before ``t2``, else ``alpha2 * t2 + beta3`` (held until expiry, then recomputed).
    Without congestion (``alpha2 == 0``) both cost ``beta2`` and retain wins the tie.
    """
    waits = [w for w in waits_s if w >= 0 and math.isfinite(w)]
    price_2 = alpha2(lam, c2, w_ref_s, price.beta3)
    t2 = host_ttl_seconds(lam, price, c2, w_ref_s)
    cost_retain = sum(price_2 * w + price.beta2 for w in waits)
    if t2 is None:
        cost_ttl = cost_retain
    else:
        cost_ttl = sum(
            price_2 * w + price.beta2 if w <= t2 else price_2 * t2 + price.beta3 for w in waits
        )
    if t2 is not None and cost_ttl < cost_retain:
        return RegimeChoice("ttl", t2, cost_retain, cost_ttl, len(waits))
    return RegimeChoice("retain", None, cost_retain, cost_ttl, len(waits))


class LambdaEstimator:
    """Online estimate of the suspension rate: events in a sliding window over its length.

    Before a full window has elapsed the rate is over the time observed so far (at least
    ``min_span_s``) so that a cold start does not read as a burst.
    """

    def __init__(self, window_s: float = 900.0, min_span_s: float = 60.0) -> None:
        if window_s <= 0 or min_span_s <= 0:
            raise ValueError("window_s and min_span_s must be > 0")
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._events: deque[float] = deque()
        self._first: float | None = None

    def observe(self, now: float) -> None:
        if self._first is None:
            self._first = now
        self._events.append(now)
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        if self._first is None:
            return 0.0
        span = min(self.window_s, max(self.min_span_s, now - self._first))
        return len(self._events) / span

    def _trim(self, now: float) -> None:
        events = self._events
        while events and events[0] < now - self.window_s:
            events.popleft()

    def to_state(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "min_span_s": self.min_span_s,
            "events": list(self._events),
            "first": self._first,
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> LambdaEstimator:
        est = cls(float(state.get("window_s", 900.0)), float(state.get("min_span_s", 60.0)))
        est._events.extend(float(t) for t in state.get("events", []))
        first = state.get("first")
        est._first = None if first is None else float(first)
        return est
