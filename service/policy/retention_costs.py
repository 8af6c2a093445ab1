"""What each host-retention branch costs on a sample of approval waits, in the finite tier.

The two branches of seed 002, 3.4 - ``retain`` (keep the host copy until resume) and ``ttl``
(discard after ``t2(lambda)``, :func:`~tenure.service.policy.retention.host_ttl_seconds`) - scored
by replaying the waits in a loss system of ``C2`` host slots
(:mod:`tenure.service.policy.host_loss`): :func:`branch_costs` per context, :func:`choose_regime`
the one-shot choice between them. The controllers that re-choose online are in
:mod:`tenure.service.policy.retention_control`. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from tenure.service.policy.host_loss import episode_cost, poisson_arrivals, steady_state_cost
from tenure.service.policy.retention import PriceVector, host_ttl_seconds, lambda_crit

__all__ = [
    "EPISODE_DRAWS",
    "EVALUATORS",
    "Branch",
    "BranchCosts",
    "RegimeChoice",
    "RetentionModel",
    "branch_costs",
    "check_lambda",
    "choose_regime",
    "clean_waits",
]

Branch = Literal["retain", "ttl"]
Evaluator = Literal["steady", "episode"]
EVALUATORS: tuple[Evaluator, ...] = ("steady", "episode")

#: Arrival streams (each with its own order of the waits) an ``episode`` score averages over.
#: The stream is the scorer's own randomness, not calibration data, and it was most of the
#: score's noise: on the mixture at 2 x lambda_crit (100 samples of 4,000 waits,
#: ``python -m tenure.service.replay.ttl_diagnose``) ttl - retain has sd 3.4% with one stream and
#: 1.45% with 16, and one stream picked the costlier branch for 20 of 100 samples, 16 for none.
#: 16 cut the stream part by 4, under the samples' own spread (about 1.2%): more streams would
#: narrow the score little, at proportional cost.
EPISODE_DRAWS = 16


def check_lambda(lam: float) -> float:
    if isinstance(lam, bool) or not (isinstance(lam, int | float) and math.isfinite(lam)):
        raise ValueError(f"lambda must be a finite rate >= 0, got {lam!r}")
    if lam < 0:
        raise ValueError(f"lambda must be a finite rate >= 0, got {lam!r}")
    return float(lam)


@dataclass(frozen=True, slots=True)
class RetentionModel:
    """What the TTL decision is priced with: price vector, host slots ``C2``, ``W_ref``.

    Stricter than :class:`PriceVector` on its own: a zero recompute cost ``beta3`` would make
    every timer zero, so it is refused here (``beta2 = 0`` is allowed: the seed's own
    sensitivity case, a host restore fully hidden behind DMA).
    """

    price: PriceVector
    c2: float
    w_ref_s: float

    def __post_init__(self) -> None:
        if not (self.price.beta3 > 0):
            raise ValueError(f"beta3 must be > 0, got {self.price.beta3!r}")
        lambda_crit(self.c2, self.w_ref_s)  # names c2 / w_ref_s when either is bad
        if self.c2 < 1:
            raise ValueError(f"c2 must be >= 1 host slot, got {self.c2!r}")

    @property
    def slots(self) -> int:
        return int(self.c2)

    @property
    def lambda_crit(self) -> float:
        return lambda_crit(self.c2, self.w_ref_s)

    def t2(self, lam: float) -> float | None:
        return host_ttl_seconds(check_lambda(lam), self.price, self.c2, self.w_ref_s)


@dataclass(frozen=True, slots=True)
class BranchCosts:
    """Mean GPU-s per suspended context under each branch, on one wait sample."""

    retain: float
    ttl: float
    t2: float | None
    lam: float
    samples: int
    evaluator: Evaluator

    def cost(self, branch: Branch) -> float:
        return self.retain if branch == "retain" else self.ttl


def clean_waits(waits_s: Sequence[float]) -> list[float]:
    waits = [float(w) for w in waits_s if math.isfinite(w) and w >= 0]
    if not waits:
        raise ValueError("waits_s (calibration samples) must hold at least one wait >= 0")
    return waits


def branch_costs(
    model: RetentionModel,
    waits_s: Sequence[float],
    lam: float,
    *,
    evaluator: Evaluator = "steady",
    seed: int = 0,
    draws: int = EPISODE_DRAWS,
) -> BranchCosts:
    """Score ``retain`` and ``ttl`` (``t2(lam)``) on ``waits_s`` at suspension rate ``lam``.

    ``steady``: the long-run cost in the loss system (what a long-running deployment pays).
    ``episode``: the seed's calibration replay: the waits arrive as a Poisson stream at ``lam``
    into an empty tier, both branches on the same stream; the mean over ``draws`` seeded
    streams (the first with the waits in the given order, the others each with its own
    shuffle), so that the choice depends on the waits, not on one draw of arrival times.
    """
    if evaluator not in EVALUATORS:
        raise ValueError(f"evaluator must be one of {', '.join(EVALUATORS)}, got {evaluator!r}")
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"draws must be an integer >= 1, got {draws!r}")
    waits = clean_waits(waits_s)
    lam = check_lambda(lam)
    t2 = model.t2(lam)
    if evaluator == "steady":
        retain = steady_state_cost(waits, lam, None, model.slots, model.price)
        ttl = retain if t2 is None else steady_state_cost(waits, lam, t2, model.slots, model.price)
    else:
        if lam == 0:
            # No arrivals to congest the tier: every copy is kept and resumed from host.
            retain = ttl = model.price.beta2
        else:
            retain, ttl = _episode_costs(model, waits, lam, t2, seed, draws)
    return BranchCosts(retain, ttl, t2, lam, len(waits), evaluator)


def _stream_seed(seed: int, k: int) -> int:
    # Not ``seed + k``: the streams of one seed must not be another seed's first stream.
    return int.from_bytes(hashlib.sha256(f"episode:{seed}:{k}".encode()).digest()[:8], "big")


def _episode_costs(
    model: RetentionModel,
    waits: list[float],
    lam: float,
    t2: float | None,
    seed: int,
    draws: int,
) -> tuple[float, float]:
    """Mean episode cost of retain and of ``t2`` over ``draws`` paired arrival streams."""
    retain_sum = ttl_sum = 0.0
    order = waits
    for k in range(draws):
        # Draw 0 is the single-stream score (seed ``seed``, waits as given).
        stream_seed = seed if k == 0 else _stream_seed(seed, k)
        if k > 0:
            order = list(waits)
            random.Random(_stream_seed(seed, -k)).shuffle(order)
        arrivals = poisson_arrivals(len(order), lam, stream_seed)
        retain = episode_cost(arrivals, order, None, model.slots, model.price).cost
        retain_sum += retain
        if t2 is None:
            ttl_sum += retain
        else:
            ttl_sum += episode_cost(arrivals, order, t2, model.slots, model.price).cost
    return retain_sum / draws, ttl_sum / draws


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
    """Score the calibration waits under host-retain and ``cpu_ttl(lambda)``; keep the cheaper.

    The two are scored in the finite host tier as a loss system (long-run cost per context,
    :func:`tenure.service.policy.host_loss.steady_state_cost`), not with the mean-field ``alpha2``
    charge: that charge only derives ``t2`` and, used to score, it prefers expiry whenever the
    mean residual wait beyond ``t2`` exceeds ``t2`` (memoryless waits included), which the
    finite-capacity replay refutes. Without congestion both branches keep every copy and
    retain wins the tie. ``cost_retain`` / ``cost_ttl`` are totals over the samples (GPU-s).
    """
    waits = [w for w in waits_s if w >= 0 and math.isfinite(w)]
    t2 = host_ttl_seconds(lam, price, c2, w_ref_s)
    if not waits:
        return RegimeChoice("retain", None, 0.0, 0.0, 0)
    costs = branch_costs(RetentionModel(price, c2, w_ref_s), waits, lam)
    n = len(waits)
    if t2 is not None and costs.ttl < costs.retain:
        return RegimeChoice("ttl", t2, costs.retain * n, costs.ttl * n, n)
    return RegimeChoice("retain", None, costs.retain * n, costs.ttl * n, n)
