"""The finite host tier as a loss system, and what a host-retention timer costs in it.

Seed 002, Appendix D: a suspended context is offloaded to host at suspension and given a
one-shot timer ``ttl`` (``None``: keep until resume). Capacity is enforced at admission: a
context that finds all ``C2`` host slots taken is not admitted and is recomputed at resume;
residents are never displaced. Costs follow equation 1 with the calibrated price vector. The
congestion price ``alpha2`` exists only to *derive* ``t2(lambda)``; here congestion is played
out directly, so holding a host slot is charged nothing (``alpha2 = alpha3 = 0``) and each
context pays its one resume cost:

* resumed from host (admitted, back before its timer): ``beta2``;
* recomputed (not admitted, or its host copy expired first): ``beta3``.

:class:`HostSlots` is that admission rule, shared by the replay and the controller's own
calibration replays. Two evaluators of a timer on a sample of waits:

* :func:`episode_cost` replays a finite episode from an empty tier (the seed's calibration:
  "replay the same calibration waits under both modes");
* :func:`steady_state_cost` is the long-run cost: the tier is an M/G/c/c loss system whose
  blocking (Erlang B) depends on the waits only through the mean slot holding time
  ``E[min(W, ttl)]``.

The two can disagree (``results/ttl/README.md``): a finite episode starting empty favours
retention, because the first ``C2`` arrivals are admitted for free and expiries near the end
free slots nobody uses.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tenure.service.policy.retention import PriceVector

__all__ = [
    "EpisodeCost",
    "HostSlots",
    "episode_cost",
    "erlang_b",
    "poisson_arrivals",
    "resume_cost",
    "steady_state_cost",
]


class HostSlots:
    """``capacity`` host slots with admission-time capacity; releases are known at admission."""

    __slots__ = ("_releases", "capacity")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity (C2) must be >= 1 slot, got {capacity!r}")
        self.capacity = capacity
        self._releases: list[float] = []

    def occupancy(self, now: float) -> int:
        self._release(now)
        return len(self._releases)

    def admit(self, now: float, hold_s: float) -> bool:
        """Admit a context for ``hold_s`` seconds if a slot is free at ``now``."""
        self._release(now)
        if len(self._releases) >= self.capacity:
            return False
        heapq.heappush(self._releases, now + hold_s)
        return True

    def _release(self, now: float) -> None:
        # A slot released at exactly ``now`` is free for an arrival at ``now``.
        releases = self._releases
        while releases and releases[0] <= now:
            heapq.heappop(releases)


def resume_cost(admitted: bool, wait_s: float, ttl_s: float | None, price: PriceVector) -> float:
    """Equation 1 in the finite-capacity replay: one context's GPU-s opportunity cost."""
    if admitted and (ttl_s is None or wait_s <= ttl_s):
        return price.beta2
    return price.beta3


@dataclass(frozen=True, slots=True)
class EpisodeCost:
    """Mean cost per suspended context and how the contexts resumed."""

    cost: float
    host_hits: int
    expired: int
    rejected: int

    @property
    def requests(self) -> int:
        return self.host_hits + self.expired + self.rejected


def poisson_arrivals(n: int, lam: float, seed: int) -> list[float]:
    """``n`` Poisson arrival times at rate ``lam`` from a seeded generator (deterministic)."""
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lambda must be a finite rate > 0, got {lam!r}")
    rng = random.Random(seed)
    at = 0.0
    out: list[float] = []
    for _ in range(n):
        at += rng.expovariate(lam)
        out.append(at)
    return out


def episode_cost(
    arrivals: Sequence[float],
    waits_s: Sequence[float],
    ttl_s: float | None,
    c2: int,
    price: PriceVector,
) -> EpisodeCost:
    """One finite episode from an empty tier: context ``i`` suspends at ``arrivals[i]`` for
    ``waits_s[i]``; every context gets the same timer ``ttl_s``."""
    if len(arrivals) != len(waits_s):
        raise ValueError("arrivals and waits_s must have the same length")
    if not waits_s:
        raise ValueError("waits_s (calibration samples) must not be empty")
    slots = HostSlots(c2)
    hits = expired = rejected = 0
    for at, wait in zip(arrivals, waits_s, strict=True):
        hold = wait if ttl_s is None else min(wait, ttl_s)
        if not slots.admit(at, hold):
            rejected += 1
        elif ttl_s is None or wait <= ttl_s:
            hits += 1
        else:
            expired += 1
    total = hits * price.beta2 + (expired + rejected) * price.beta3
    return EpisodeCost(total / len(waits_s), hits, expired, rejected)


#: Above this many slots the exact recursion is replaced by the fluid limit.
_ERLANG_EXACT_MAX = 1_000_000


def erlang_b(c: int, a: float) -> float:
    """Blocking probability of an M/G/c/c loss system with offered load ``a`` (Erlangs)."""
    if c < 0:
        raise ValueError(f"c must be >= 0, got {c!r}")
    if a <= 0:
        return 0.0 if c > 0 else 1.0
    if c > _ERLANG_EXACT_MAX:
        return max(0.0, 1.0 - c / a)
    # 1/B(k) = 1 + (k/a) / B(k-1): the numerically stable direction of the recursion.
    inv = 1.0
    for k in range(1, c + 1):
        inv = 1.0 + inv * k / a
    return 1.0 / inv


def steady_state_cost(
    waits_s: Sequence[float], lam: float, ttl_s: float | None, c2: int, price: PriceVector
) -> float:
    """Long-run mean cost per context of timer ``ttl_s`` at suspension rate ``lam``."""
    if not waits_s:
        raise ValueError("waits_s (calibration samples) must not be empty")
    n = len(waits_s)
    if ttl_s is None:
        hold = sum(waits_s) / n
        back_in_time = 1.0
    else:
        hold = sum(min(w, ttl_s) for w in waits_s) / n
        back_in_time = sum(1 for w in waits_s if w <= ttl_s) / n
    blocked = erlang_b(c2, lam * hold)
    hit = (1.0 - blocked) * back_in_time
    return hit * price.beta2 + (1.0 - hit) * price.beta3
