"""Finite-capacity replay of suspended contexts under a host-retention policy (seed 002, App. D).

Each context suspends at its arrival time, is offloaded to host and gets a one-shot timer from
the policy (``None``: keep until resume); the tier admits it only if one of its ``C2`` slots is
free then (residents are never displaced); its cost is :func:`~tenure.service.policy.host_loss.
resume_cost` (equation 1 with the calibrated price vector). The admission rule and the cost are
the core's own (:class:`~tenure.service.policy.host_loss.HostSlots`), so the controller's
calibration replays and this replay cannot drift apart.

Policies that learn (the online controller) see what a sidecar sees: every suspension when it
happens and every resume (with its wait) when it happens, whether or not the host copy
survived; events are processed in time order, resumes at ``t`` before a suspension at ``t``.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tenure.service.policy.host_loss import HostSlots, resume_cost
from tenure.service.policy.rent import RentClock
from tenure.service.policy.retention import PriceVector

__all__ = [
    "FixedTimer",
    "RentLimit",
    "RentTrace",
    "ReplayResult",
    "TTLPolicy",
    "poisson_arrivals",
    "replay_policy",
    "replay_timers",
    "thinned_arrivals",
]


@dataclass(frozen=True, slots=True)
class RentLimit:
    """A re-priced timer: the copy expires when its policy's rent clock reaches ``limit``."""

    limit: float


class TTLPolicy(Protocol):
    def on_suspend(self, now: float) -> float | RentLimit | None:
        """The timer for a context suspending at ``now`` (``None``: retain until resume)."""

    def on_resume(self, now: float, wait_s: float) -> None: ...


@dataclass
class RentTrace:
    """The knots of a policy's :class:`~tenure.service.policy.rent.RentClock` (one per re-pricing),
    so that a copy's expiry can be found once the whole stream has priced it."""

    at: list[float]
    accrued: list[float]
    rate: list[float]

    @classmethod
    def empty(cls) -> RentTrace:
        return cls([], [], [])

    def record(self, clock: RentClock) -> None:
        if clock.at is None:
            return
        if self.at and clock.at == self.at[-1]:
            self.accrued[-1], self.rate[-1] = clock.accrued, clock.rate
            return
        self.at.append(clock.at)
        self.accrued.append(clock.accrued)
        self.rate.append(clock.rate)

    def expiry(self, limit: float) -> float:
        """When the clock reached ``limit`` (``inf``: it never did)."""
        k = bisect.bisect_left(self.accrued, limit) - 1
        if k < 0:
            return self.at[0] if self.at else float("inf")
        rate = self.rate[k]
        if rate <= 0:
            return float("inf")  # only possible on the last knot: later ones accrued more
        return self.at[k] + (limit - self.accrued[k]) / rate


@dataclass(frozen=True)
class FixedTimer:
    ttl_s: float | None

    def on_suspend(self, now: float) -> float | None:
        return self.ttl_s

    def on_resume(self, now: float, wait_s: float) -> None:
        return None


@dataclass(frozen=True)
class ReplayResult:
    """Per-context costs (GPU-s) and outcomes, in arrival order."""

    costs: np.ndarray
    ttls: np.ndarray  # inf: retained
    admitted: np.ndarray

    @property
    def mean_cost(self) -> float:
        return float(self.costs.mean())

    def outcome_counts(self, waits: np.ndarray) -> dict[str, int]:
        expired = self.admitted & (waits > self.ttls)
        return {
            "host_hits": int((self.admitted & ~expired).sum()),
            "expired": int(expired.sum()),
            "rejected": int((~self.admitted).sum()),
        }


def poisson_arrivals(n: int, lam: float, rng: np.random.Generator) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / lam, n))


def thinned_arrivals(
    rate_at: Callable[[float], float], rate_max: float, horizon_s: float, rng: np.random.Generator
) -> np.ndarray:
    """A non-homogeneous Poisson stream on ``[0, horizon_s)`` by thinning (Lewis-Shedler)."""
    out: list[float] = []
    at = 0.0
    while True:
        at += float(rng.exponential(1.0 / rate_max))
        if at >= horizon_s:
            break
        if rng.random() * rate_max <= rate_at(at):
            out.append(at)
    return np.asarray(out)


def replay_timers(
    arrivals: np.ndarray, waits: np.ndarray, ttls: np.ndarray, c2: int, price: PriceVector
) -> ReplayResult:
    """Replay given per-context timers (``inf``: retain) — fixed and per-phase policies."""
    slots = HostSlots(c2)
    costs = np.empty(len(arrivals))
    admitted = np.zeros(len(arrivals), dtype=bool)
    for i, (at, wait, ttl) in enumerate(
        zip(arrivals.tolist(), waits.tolist(), ttls.tolist(), strict=True)
    ):
        timer = None if ttl == float("inf") else ttl
        ok = slots.admit(at, wait if timer is None else min(wait, timer))
        admitted[i] = ok
        costs[i] = resume_cost(ok, wait, timer, price)
    return ReplayResult(costs, ttls.astype(float), admitted)


def replay_policy(
    arrivals: np.ndarray,
    waits: np.ndarray,
    policy: TTLPolicy,
    c2: int,
    price: PriceVector,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayResult:
    """Replay a policy that may learn from the event stream.

    A policy learns only from suspensions and resumes, which happen whatever the tier did with
    the copies, so its timers are found first (in event order) and the tier replayed after: a
    re-priced timer (:class:`RentLimit`) becomes the seconds its clock took to reach the limit.
    """
    n = len(arrivals)
    timers: list[float | RentLimit | None] = []
    pending: list[tuple[float, int, float]] = []  # (resume time, seq, wait)
    step = max(1, n // 200)
    for i, (at, wait) in enumerate(zip(arrivals.tolist(), waits.tolist(), strict=True)):
        while pending and pending[0][0] <= at:
            back, _seq, waited = heapq.heappop(pending)
            policy.on_resume(back, waited)
        timers.append(policy.on_suspend(at))
        heapq.heappush(pending, (at + wait, i, wait))
        if progress is not None and i % step == 0:
            progress(i, n)
    trace: RentTrace | None = getattr(policy, "rent_trace", None)
    ttls = np.empty(n)
    for i, (at, timer) in enumerate(zip(arrivals.tolist(), timers, strict=True)):
        if isinstance(timer, RentLimit):
            if trace is None:
                raise TypeError("a policy that returns RentLimit timers needs a rent_trace")
            timer = max(0.0, trace.expiry(timer.limit) - at)
        ttls[i] = float("inf") if timer is None else timer
    return replay_timers(arrivals, waits, ttls, c2, price)
