"""The retention rule: the host timer from the wait sample and the congestion price (issue 26).

The seed's controller chooses between two branches, ``retain`` and one timer ``t2(lambda)``.
On the real human-approval gaps of the Claude Code trace neither is right: the best timer is
about twice ``t2`` at 2 and 3 x lambda_crit, and the cost against the timer has a sharp
minimum (the timer that just fills the ``C2`` host slots: shorter, copies expire that would
have come back; longer, the tier blocks new ones), so a coarse family cannot express it.

The rule here chooses the **rent budget** of a held copy instead of a branch: a copy
suspended at ``s`` expires when the tenant's rent clock (:mod:`tenure.service.policy.rent`) reaches
``R(s) + scale x (beta3 - beta2)``. ``scale = 1`` is the seed's ``t2`` (the break-even), any
other scale a timer ``scale x t2(lambda)`` at a constant price, re-priced like ``t2`` when
lambda moves; ``None`` keeps the copy until resume (retain). Below ``lambda_crit`` the price is
zero and every scale keeps every copy.

The scale minimises the **expected** cost per suspended context over a grid (a coarse log
grid, then a fine one around its best), the expectation taken over Bayesian-bootstrap
resamples of the wait sample: a small or drifting sample's uncertainty is priced in (a timer
on the edge of the cliff costs a lot in the resamples that have a little more mass beyond
it, so the choice backs off the edge by what the sample cannot rule out). The cost of one
candidate on one resample is the core's loss-system score (:mod:`tenure.service.policy.host_loss`):
``steady`` (Erlang B, the long-run cost of a running tier) or ``episode`` (the seed's finite
replay from an empty tier, all candidates on the same arrival stream). Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

from tenure.service.policy.host_loss import episode_cost, poisson_arrivals
from tenure.service.policy.rent import rent_budget
from tenure.service.policy.retention_costs import (
    Evaluator,
    RetentionModel,
    check_inputs,
)

__all__ = [
    "COARSE_SCALES",
    "CRITERIA",
    "RESAMPLES",
    "Criterion",
    "TimerChoice",
    "check_scale",
    "choose_timer",
    "scale_budget",
    "timer_for_scale",
]

#: The coarse grid of rent-budget scales (multiples of ``t2``): 0.5 ... 8 in quarter octaves.
#: The fine pass then tries sixteenth octaves (4.4% apart) around the coarse best, so the
#: chosen timer is within 2.2% of the grid's best: the cost curve's minimum on the real gaps
#: is about +-8% wide at 1% (``results/ttl/README.md``).
COARSE_SCALES: tuple[float, ...] = tuple(2.0 ** (i / 4) for i in range(-4, 17))
_FINE_STEPS: tuple[int, ...] = (-3, -2, -1, 1, 2, 3)
#: Bootstrap resamples an expected cost averages over (each episode resample has its own
#: arrival stream too). 16: as many streams as the seed's branch score averages
#: (``retention_costs.EPISODE_DRAWS``), where 16 took the stream noise under the sample's.
RESAMPLES = 16

#: How the candidates' resampled costs are compared: ``mean`` (least expected cost) or
#: ``regret`` (least worst-case relative regret over the resamples, against the best candidate
#: of each resample).
Criterion = Literal["mean", "regret"]
CRITERIA: tuple[Criterion, ...] = ("mean", "regret")


def scale_budget(model: RetentionModel, scale: float | None) -> float | None:
    """The rent budget (GPU-s) of a copy held under ``scale`` (``None``: retain)."""
    if scale is None:
        return None
    return scale * rent_budget(model.price)


def timer_for_scale(model: RetentionModel, scale: float | None, lam: float) -> float | None:
    """The timer ``scale x t2(lam)`` a copy gets at a constant price (``None``: kept)."""
    if scale is None:
        return None
    t2 = model.t2(lam)
    return None if t2 is None else scale * t2


@dataclass(frozen=True, slots=True)
class TimerChoice:
    """The rule's choice on one sample at one lambda, with every candidate's expected cost."""

    #: Rent-budget scale (multiple of ``t2``); ``None``: retain until resume.
    scale: float | None
    lam: float
    t2: float | None
    #: The timer at this lambda (``scale x t2``), ``None`` when kept until resume.
    timer_s: float | None
    #: Expected GPU-s per suspended context of the choice, and of retain and ``t2`` beside it.
    cost: float
    cost_retain: float
    cost_t2: float
    #: Bootstrap sd of the choice's cost (how much the sample leaves open).
    cost_sd: float
    samples: int
    resamples: int
    evaluator: Evaluator
    #: (scale or None, expected cost) of every candidate tried, in the order tried.
    candidates: tuple[tuple[float | None, float], ...] = field(default=())
    #: The expected cost of the scale in use before (``incumbent``), on the same resamples.
    cost_incumbent: float | None = None
    #: The candidate of least worst-case regret over the resamples, and its expected cost
    #: (the ``regret`` criterion's choice, whichever criterion chose ``scale``).
    regret_scale: float | None = None
    regret_cost: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "lam": self.lam,
            "t2_s": self.t2,
            "timer_s": self.timer_s,
            "cost": self.cost,
            "cost_retain": self.cost_retain,
            "cost_t2": self.cost_t2,
            "cost_sd": self.cost_sd,
            "samples": self.samples,
            "resamples": self.resamples,
            "evaluator": self.evaluator,
            "cost_incumbent": self.cost_incumbent,
            "regret_scale": self.regret_scale,
            "regret_cost": self.regret_cost,
        }


def _seed(seed: int, k: int) -> int:
    return int.from_bytes(hashlib.sha256(f"timer-rule:{seed}:{k}".encode()).digest()[:8], "big")


class _Scorer:
    """Expected cost of a timer over the resamples of one sample (memoised per timer)."""

    def __init__(
        self,
        model: RetentionModel,
        waits: list[float],
        lam: float,
        evaluator: Evaluator,
        resamples: int,
        seed: int,
        episode_len: int,
        mean_prior_s: float | None = None,
        ages_s: Sequence[float] = (),
    ) -> None:
        import numpy as np  # the replay extra's; only the opt-in timer rule scores

        self.model = model
        self.lam = lam
        self.evaluator = evaluator
        self.resamples = resamples
        self._ages = tuple(ages_s)
        self._memo: dict[float | None, np.ndarray] = {}
        w = np.sort(np.asarray(waits, dtype=float))
        self._waits = w
        if evaluator == "steady":
            gen = np.random.default_rng(_seed(seed, -1))
            # Bayesian bootstrap: Dirichlet(1, ..., 1) weights on the sorted sample.
            weights = gen.dirichlet(np.ones(len(w)), size=resamples)
            if mean_prior_s is not None:
                w, weights = _complete_tail(w, weights, mean_prior_s)
                self._waits = w
            self._cum = np.cumsum(weights * w, axis=1)
            self._cum_w = np.cumsum(weights, axis=1)
        else:
            self._streams: list[tuple[list[float], list[float]]] = []
            for k in range(resamples):
                rng = random.Random(_seed(seed, k))
                order = [w[rng.randrange(len(w))] for _ in range(episode_len)]
                arrivals = poisson_arrivals(episode_len, lam, _seed(seed, -k - 2))
                self._streams.append((arrivals, order))

    def costs(self, timer: float | None) -> np.ndarray:
        key = None if timer is None else float(timer)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._steady(key) if self.evaluator == "steady" else self._episode(key)
            self._memo[key] = hit
        return hit

    def _steady(self, timer: float | None) -> np.ndarray:
        import numpy as np

        price = self.model.price
        back = self._within(timer)[1]
        # The offered load a context suspending at tier age u meets: lam x E[min(W, T, u)]
        # (the copies suspended since the tier started empty that still hold a slot); the
        # long run (no ages) is u = inf, Erlang B's steady state.
        cap = math.inf if timer is None else timer
        holds = [self._within(min(cap, u))[0] for u in self._ages] or [self._within(timer)[0]]
        blocked = _erlang_b(self.model.slots, self.lam * np.stack(holds))
        hit = (1.0 - blocked) * back[None, :]
        cost: np.ndarray = (hit * price.beta2 + (1.0 - hit) * price.beta3).mean(axis=0)
        return cost

    def _within(self, timer: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Per resample: ``E[min(W, timer)]`` and ``P(W <= timer)`` (``None``, inf: keep)."""
        import numpy as np

        w = self._waits
        if timer is None or math.isinf(timer):
            return self._cum[:, -1], np.ones(self.resamples)
        k = int(np.searchsorted(w, timer, side="right"))  # waits <= timer
        below = self._cum[:, k - 1] if k > 0 else np.zeros(self.resamples)
        back = self._cum_w[:, k - 1] if k > 0 else np.zeros(self.resamples)
        return below + timer * (1.0 - back), back

    def _episode(self, timer: float | None) -> np.ndarray:
        import numpy as np

        m = self.model
        return np.array(
            [episode_cost(at, order, timer, m.slots, m.price).cost for at, order in self._streams]
        )


def _erlang_b(c: int, loads: np.ndarray) -> np.ndarray:
    """:func:`~tenure.service.policy.host_loss.erlang_b` over an array of offered loads (the
    same recursion, the same floating-point steps: equal element for element)."""
    import numpy as np

    a = np.where(loads > 0, loads, 1.0)
    inv = np.ones_like(a)
    # A light load's 1/B overflows to inf (B = 0), as the scalar recursion's float does.
    with np.errstate(over="ignore"):
        for k in range(1, c + 1):
            inv = 1.0 + inv * k / a
    return np.where(loads > 0, 1.0 / inv, 0.0 if c > 0 else 1.0)


#: Where the unseen tail's mass is put (multiples of the prior mean): far enough that no
#: candidate timer reaches it, so it holds every candidate's slot for the whole timer and
#: always comes back too late.
_TAIL_AT = 16.0


def _complete_tail(
    waits: np.ndarray, weights: np.ndarray, mean_prior_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Give each resample the tail its mean lacks: a resample whose mean is below the prior
    mean (the configured ``W_ref``) gets mass ``p`` at ``_TAIL_AT x W_ref`` so that its mean
    is ``W_ref``. A sample collected over a finite horizon (resumes of the last hours) cannot
    contain the waits longer than that horizon, and on heavy-tailed human gaps those hold
    most of the mean: without this, keeping every copy looks cheap exactly when it is not.
    A resample already at or above the prior mean is left alone (the prior never shortens
    a tail the data show)."""
    import numpy as np

    tail = max(_TAIL_AT * mean_prior_s, float(waits[-1]) if len(waits) else 0.0) + 1.0
    means = weights @ waits
    p = np.clip((mean_prior_s - means) / (tail - means), 0.0, 1.0)
    scaled = weights * (1.0 - p)[:, None]
    return np.append(waits, tail), np.concatenate([scaled, p[:, None]], axis=1)


def choose_timer(
    model: RetentionModel,
    waits_s: Sequence[float],
    lam: float,
    *,
    evaluator: Evaluator = "steady",
    resamples: int = RESAMPLES,
    seed: int = 0,
    episode_len: int | None = None,
    incumbent: float | None = None,
    mean_prior_s: float | None = None,
    criterion: Criterion = "mean",
    ages_s: Sequence[float] = (),
) -> TimerChoice:
    """The rent-budget scale with the least expected cost on ``waits_s`` at rate ``lam``.

    Candidates: retain, the coarse scales, then the fine ones around the coarse best (each
    scored on the same resamples: paired). Ties go to the longer hold (retain first): a timer
    too short costs more than one too long. Uncongested (``t2`` is none) there is nothing to
    choose: retain, costed once. ``episode_len`` (episode evaluator): contexts per replayed
    episode, the sample's size by default. ``incumbent``: the scale in use now (``None``:
    retain), scored on the same resamples (``cost_incumbent``) for the caller's hysteresis.
    ``mean_prior_s`` (steady evaluator): the wait law's prior mean (``W_ref``); a resample
    with a smaller mean gets the missing tail far out (:func:`_complete_tail`).
    """
    waits, lam, t2 = check_inputs(model, waits_s, lam, evaluator, resamples, "resamples")
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {', '.join(CRITERIA)}, got {criterion!r}")
    if t2 is None or lam == 0:
        return TimerChoice(
            None, lam, None, None, model.price.beta2, model.price.beta2, model.price.beta2,
            0.0, len(waits), 0, evaluator, cost_incumbent=model.price.beta2,
        )  # fmt: skip
    n_ep = len(waits) if episode_len is None else episode_len
    if n_ep < 1:
        raise ValueError(f"episode_len must be >= 1, got {episode_len!r}")
    if any(not (math.isfinite(u) and u >= 0) for u in ages_s):
        raise ValueError(f"ages_s must be finite numbers >= 0, got {list(ages_s)!r}")
    scorer = _Scorer(model, waits, lam, evaluator, resamples, seed, n_ep, mean_prior_s, ages_s)
    tried: list[tuple[float | None, float]] = []

    def mean(scale: float | None) -> float:
        value = float(scorer.costs(None if scale is None else scale * t2).mean())
        tried.append((scale, value))
        return value

    best_scale: float | None = None
    best = mean(None)
    # Longest first, so that a tie keeps the longer hold.
    for scale in sorted(COARSE_SCALES, reverse=True):
        value = mean(scale)
        if value < best * (1 - 1e-9):
            best, best_scale = value, scale
    if best_scale is not None:
        coarse = best_scale
        for step in sorted(_FINE_STEPS, reverse=True):
            scale = coarse * 2.0 ** (step / 16)
            value = mean(scale)
            if value < best * (1 - 1e-9):
                best, best_scale = value, scale
    import numpy as np

    # The least worst-case regret (relative, against each resample's best candidate) among
    # the candidates tried: ``tried`` is retain, then longest first, so argmin keeps the
    # longer hold on a tie.
    scales = [sc for sc, _v in tried]
    table = np.array([scorer.costs(None if sc is None else sc * t2) for sc in scales])
    pick = int(np.argmin((table / table.min(axis=0) - 1.0).max(axis=1)))
    regret_scale, regret_cost = scales[pick], float(table[pick].mean())
    if criterion == "regret":
        best_scale, best = regret_scale, regret_cost
    chosen = scorer.costs(None if best_scale is None else best_scale * t2)
    incumbent = check_scale(incumbent)
    held = scorer.costs(None if incumbent is None else incumbent * t2)
    return TimerChoice(
        best_scale,
        lam,
        t2,
        None if best_scale is None else best_scale * t2,
        best,
        float(scorer.costs(None).mean()),
        float(scorer.costs(t2).mean()),
        float(chosen.std()),
        len(waits),
        resamples,
        evaluator,
        tuple(tried),
        float(held.mean()),
        regret_scale,
        regret_cost,
    )


def check_scale(scale: float | None) -> float | None:
    """A stored or configured scale: ``None`` (retain) or a finite number > 0."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise ValueError(f"timer scale must be a number > 0 or null, got {scale!r}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"timer scale must be a finite number > 0 or null, got {scale!r}")
    return float(scale)
