"""The host-retention controllers: the seed's one-shot one and Tenure's online one.

Both choose, for a suspended context's host copy, between two branches (seed 002, 3.4):
``retain`` (keep until resume) and ``ttl`` (discard after ``t2(lambda)``, the load-indexed
timer of :func:`~tenure.service.policy.retention.host_ttl_seconds`), by scoring a sample of approval
waits under each in the finite host tier (:mod:`tenure.service.policy.host_loss`).

* :class:`OneShotController` is the seed's: a configured ``lambda`` and one calibration sample,
  scored once (by replaying the sample as a finite episode, as the seed does); the branch is
  frozen; ``t2`` follows whatever ``lambda`` the caller passes (configured, or an online
  estimate).
* :class:`OnlineController` is Tenure's: ``lambda`` estimated from the suspension stream (or
  pinned), waits re-collected from observed resumes (the last ``window`` suspensions, those not
  back yet kept as censored observations: see
  :class:`~tenure.service.policy.waits.SuspensionCohort`), and the branch re-chosen every
  ``period_s`` with hysteresis (the challenger must be cheaper by ``margin``) so it does not flap on
  sampling noise.

Pure: no I/O, no clock; time is an argument and state round-trips through ``to_state``. Every
choice is a :class:`RetentionDecision` carrying its reason, which the sidecar logs and counts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from tenure.service.policy.rate import (
    RateEstimator,
    rate_estimator,
    rate_estimator_from_state,
    rate_lower_bound,
)
from tenure.service.policy.rent import RentClock
from tenure.service.policy.retention import alpha2
from tenure.service.policy.retention_costs import (
    EVALUATORS,
    Branch,
    BranchCosts,
    Evaluator,
    RetentionModel,
    branch_costs,
    check_lambda,
    clean_waits,
)
from tenure.service.policy.retention_rule import (
    RESAMPLES,
    Criterion,
    TimerChoice,
    check_scale,
    choose_timer,
    scale_budget,
    timer_for_scale,
)
from tenure.service.policy.waits import SuspensionCohort, WaitWindow

__all__ = [
    "CalibratedTimer",
    "OneShotController",
    "OnlineController",
    "OnlineSettings",
    "RetentionDecision",
    "rechoose_branch",
]


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    """One (re)choice of the host branch and why."""

    at: float
    branch: Branch
    lam: float
    lam_source: Literal["configured", "estimated", "pinned"]
    lambda_crit: float
    host_ttl_s: float | None
    cost_retain: float | None
    cost_ttl: float | None
    samples: int
    changed: bool
    reason: str
    #: The timer rule's rent-budget scale (multiple of ``t2``; ``None``: retain or the seed's
    #: branch rule) and what it was chosen on (:class:`~tenure.service.policy.retention_rule.
    #: TimerChoice` as a dict: costs, sample size, resamples).
    scale: float | None = None
    choice: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Points between now and the horizon at which the timer rule scores the tier's age.
_AGE_POINTS = 8


def _summary(waits: Sequence[float], source: str) -> dict[str, Any]:
    """What a choice was made on: where the waits came from, how many, their shape."""
    ordered = sorted(waits)
    n = len(ordered)

    def q(p: float) -> float | None:
        return ordered[min(n - 1, int(p * n))] if n else None

    return {
        "source": source,
        "n": n,
        "mean_s": sum(ordered) / n if n else None,
        "p50_s": q(0.5),
        "p90_s": q(0.9),
        "p99_s": q(0.99),
        "max_s": ordered[-1] if n else None,
    }


def _thin(waits: Sequence[float], m: int) -> list[float]:
    """``m`` evenly spaced order statistics of ``waits`` (all of them when ``m`` >= their
    number): a smaller sample with the same shape, deterministic."""
    ordered = sorted(waits)
    n = len(ordered)
    if m >= n:
        return ordered
    return [ordered[min(n - 1, int((i + 0.5) * n / m))] for i in range(max(0, m))]


def _scale_name(scale: float | None) -> str:
    return "retain" if scale is None else f"{scale:.3g} x t2"


def _pct(new: float, old: float) -> str:
    return f"{(new - old) / old * 100:+.1f}%" if old > 0 else "n/a"


def rechoose_branch(
    model: RetentionModel,
    waits_s: Sequence[float],
    lam: float,
    current: Branch,
    *,
    now: float,
    margin: float = 0.02,
    min_samples: int = 1,
    evaluator: Evaluator = "steady",
    lam_source: Literal["configured", "estimated", "pinned"] = "estimated",
    seed: int = 0,
) -> RetentionDecision:
    """Keep ``current`` unless the other branch is cheaper by more than ``margin`` (relative).

    The stateless step the online controller (and the sidecar, with waits and lambda from
    Redis) calls each period.
    """
    if not (math.isfinite(margin) and 0 <= margin < 1):
        raise ValueError(f"margin must be in [0, 1), got {margin!r}")
    lam = check_lambda(lam)
    crit = model.lambda_crit
    waits = [float(w) for w in waits_s if math.isfinite(w) and w >= 0]

    def keep(reason: str, costs: BranchCosts | None = None) -> RetentionDecision:
        ttl = model.t2(lam) if current == "ttl" else None
        return RetentionDecision(
            now,
            current,
            lam,
            lam_source,
            crit,
            ttl,
            None if costs is None else costs.retain,
            None if costs is None else costs.ttl,
            len(waits),
            False,
            reason,
        )

    if lam <= crit:
        return keep(
            f"uncongested: lambda {lam:.4g}/s <= lambda_crit {crit:.4g}/s, both branches keep "
            f"every host copy; staying on {current}"
        )
    if len(waits) < max(1, min_samples):
        return keep(f"{len(waits)} observed waits < {min_samples} needed; staying on {current}")
    costs = branch_costs(model, waits, lam, evaluator=evaluator, seed=seed)
    other: Branch = "ttl" if current == "retain" else "retain"
    mine, theirs = costs.cost(current), costs.cost(other)
    detail = (
        f"at lambda {lam:.4g}/s ({lam / crit:.2f} x lambda_crit), t2 {costs.t2:.0f} s, "
        f"{costs.samples} waits ({evaluator}): retain {costs.retain:.4f}, "
        f"ttl {costs.ttl:.4f} GPU-s/context"
    )
    if theirs < mine * (1 - margin):
        ttl = costs.t2 if other == "ttl" else None
        return RetentionDecision(
            now,
            other,
            lam,
            lam_source,
            crit,
            ttl,
            costs.retain,
            costs.ttl,
            costs.samples,
            True,
            f"switched {current} -> {other} ({_pct(theirs, mine)}) {detail}",
        )
    why = (
        f"{other} costs {_pct(theirs, mine)} more"
        if theirs >= mine
        else f"{other} {_pct(theirs, mine)} is within the {margin:.0%} margin"
    )
    return keep(f"kept {current}: {why}; {detail}", costs)


class OneShotController:
    """The seed's controller: configured ``lambda``, one calibration sample, branch frozen."""

    def __init__(
        self,
        model: RetentionModel,
        *,
        lam: float,
        calibration_waits_s: Sequence[float],
        calibration_lam: float | None = None,
        evaluator: Evaluator = "episode",
        seed: int = 0,
    ) -> None:
        self.model = model
        self.lam = check_lambda(lam)
        at_lam = self.lam if calibration_lam is None else check_lambda(calibration_lam)
        costs = branch_costs(
            model, clean_waits(calibration_waits_s), at_lam, evaluator=evaluator, seed=seed
        )
        # Retain wins ties (identical below lambda_crit): the seed's default branch.
        self.branch: Branch = "ttl" if costs.ttl < costs.retain else "retain"
        self.decision = RetentionDecision(
            0.0,
            self.branch,
            self.lam,
            "configured",
            model.lambda_crit,
            model.t2(self.lam) if self.branch == "ttl" else None,
            costs.retain,
            costs.ttl,
            costs.samples,
            True,
            f"calibrated once at lambda {at_lam:.4g}/s on {costs.samples} waits ({evaluator}): "
            f"retain {costs.retain:.4f}, ttl {costs.ttl:.4f} GPU-s/context -> {self.branch}",
        )

    def host_ttl(self, lam: float | None = None) -> float | None:
        """The timer for a context suspending now: ``t2(lam)`` on the ttl branch, else none."""
        if self.branch == "retain":
            return None
        return self.model.t2(self.lam if lam is None else lam)

    @property
    def scale(self) -> float | None:
        """The branch as a rent-budget scale: ``t2`` is scale 1."""
        return None if self.branch == "retain" else 1.0


class CalibratedTimer:
    """The timer rule calibrated once: configured ``lambda``, one calibration sample.

    The scale minimises the expected cost on the sample at the configured ``lambda``
    (:func:`~tenure.service.policy.retention_rule.choose_timer`, the seed's episode score by
    default, over bootstrap resamples); the timer at another ``lambda`` (an online estimate)
    is that scale times ``t2`` there, or with the rent clock the scale's rent budget.
    """

    def __init__(
        self,
        model: RetentionModel,
        *,
        lam: float,
        calibration_waits_s: Sequence[float],
        evaluator: Evaluator = "episode",
        resamples: int = RESAMPLES,
        seed: int = 0,
        criterion: Criterion = "mean",
    ) -> None:
        self.model = model
        self.lam = check_lambda(lam)
        self.choice: TimerChoice = choose_timer(
            model, calibration_waits_s, self.lam, evaluator=evaluator, resamples=resamples,
            seed=seed, criterion=criterion,
        )  # fmt: skip
        self.scale = self.choice.scale
        self.branch: Branch = "retain" if self.scale is None else "ttl"

    def host_ttl(self, lam: float | None = None) -> float | None:
        return timer_for_scale(self.model, self.scale, self.lam if lam is None else lam)


@dataclass(frozen=True, slots=True)
class OnlineSettings:
    """Knobs of the online controller (defaults: the drift experiment's choice)."""

    #: Rate estimator spec (:func:`tenure.service.policy.rate.rate_estimator`).
    estimator: str = "changepoint:300"
    #: Re-choose the branch this often (seconds).
    period_s: float = 900.0
    #: The challenger must be cheaper by this fraction to take over.
    margin: float = 0.05
    #: Observed waits needed before the first re-choice.
    min_samples: int = 200
    #: Suspensions (and observed waits) kept, the newest.
    window: int = 2000
    #: Score the recent suspensions with the pending ones as censored waits (else: only the
    #: waits of observed resumes, which read short after a change).
    censored: bool = True
    evaluator: Evaluator = "steady"
    initial_branch: Branch = "retain"
    #: An SRE-pinned lambda (suspensions/s) instead of the estimate.
    pinned_lambda: float | None = None
    #: Price with the estimate this many standard errors low (0: the estimate itself): a
    #: timer too short costs far more than one a little too long.
    lambda_z: float = 1.0
    #: ``repriced``: a held copy expires when the rent clock reaches its limit (the price
    #: follows lambda while it is held, :mod:`tenure.service.policy.rent`); ``oneshot``: at ``t2``
    #: of the lambda at its suspension (the seed's timer). Equal while lambda stays put.
    timer: Literal["repriced", "oneshot"] = "repriced"
    #: ``timer``: the retention rule (:mod:`tenure.service.policy.retention_rule`: a rent-budget
    #: scale from a fine grid, the sample's uncertainty priced in by bootstrap resamples);
    #: ``branch``: the seed's two branches (retain, or ``t2``; the default here, so that a
    #: bare ``OnlineSettings()`` is the controller of issue 13; the sidecar and the replay
    #: name the rule they run).
    rule: Literal["timer", "branch"] = "branch"
    #: The timer rule's hysteresis: a new scale must be cheaper by this (relative) in
    #: expectation. Smaller than ``margin``: the resamples already price the sample's noise,
    #: and a few percent is the whole distance between neighbouring timers on a steep cost.
    timer_margin: float = 0.01
    #: Bootstrap resamples of the timer rule's expected cost.
    resamples: int = RESAMPLES
    #: The timer rule completes a sample whose mean is below ``W_ref`` with a far tail
    #: (:func:`~tenure.service.policy.retention_rule.choose_timer`'s ``mean_prior_s``): waits longer
    #: than the hours a sample was collected over are missing from it.
    tail_prior: bool = True
    #: The timer rule's planning horizon: the tier's age (seconds since the controller saw
    #: its first suspension, when the tier was empty) at which its objective ends. ``None``
    #: (the sidecar's): the long run, Erlang B's steady state. A number: the suspensions
    #: from now to that age are scored at the tier's age when they come (a tier that started
    #: empty holds only the copies suspended since; on a heavy tail keeping every copy costs
    #: far less in its first hours than in steady state). The replay's episode has a known
    #: end (``requests / lambda``): the objective it scores (issue 26, session 3).
    horizon_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("period_s",):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.margin) and 0 <= self.margin < 1):
            raise ValueError(f"margin must be in [0, 1), got {self.margin!r}")
        if self.min_samples < 1:
            raise ValueError(f"min_samples must be >= 1, got {self.min_samples!r}")
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window!r}")
        if self.evaluator not in EVALUATORS:
            raise ValueError(f"evaluator must be one of {', '.join(EVALUATORS)}")
        if self.initial_branch not in ("retain", "ttl"):
            raise ValueError("initial_branch must be 'retain' or 'ttl'")
        if self.pinned_lambda is not None:
            check_lambda(self.pinned_lambda)
        if not (math.isfinite(self.lambda_z) and self.lambda_z >= 0):
            raise ValueError(f"lambda_z must be a finite number >= 0, got {self.lambda_z!r}")
        if self.timer not in ("repriced", "oneshot"):
            raise ValueError("timer must be 'repriced' or 'oneshot'")
        if self.rule not in ("timer", "branch"):
            raise ValueError("rule must be 'timer' or 'branch'")
        if not (math.isfinite(self.timer_margin) and 0 <= self.timer_margin < 1):
            raise ValueError(f"timer_margin must be in [0, 1), got {self.timer_margin!r}")
        if self.horizon_s is not None and not (
            math.isfinite(self.horizon_s) and self.horizon_s > 0
        ):
            raise ValueError(
                f"horizon_s must be a finite number > 0 or None, got {self.horizon_s!r}"
            )
        if self.resamples < 1:
            raise ValueError(f"resamples must be >= 1, got {self.resamples!r}")
        rate_estimator(self.estimator)  # names a bad spec now, not at the first event


@dataclass
class OnlineController:
    """Tenure's online controller; feed it events, ask it for timers and periodic decisions."""

    model: RetentionModel
    settings: OnlineSettings = field(default_factory=OnlineSettings)
    estimator: RateEstimator | None = None
    waits: WaitWindow | None = None
    cohort: SuspensionCohort | None = None
    branch: Branch | None = None
    last_decision_at: float | None = None
    decisions: int = 0
    switches: int = 0
    #: The congestion rent a held copy pays, re-priced at every suspension and decision
    #: (:mod:`tenure.service.policy.rent`).
    rent: RentClock = field(default_factory=RentClock)
    #: The timer rule's rent-budget scale in use (``None``: retain); the branch rule's is 1
    #: on ttl. Starts at the initial branch's.
    scale: float | None = None
    #: The timer rule's prior, a calibration sample (the SRE's ``POST /admin/waits`` in the
    #: sidecar: the one-shot calibration): scored alone while fewer than ``min_samples`` waits
    #: were observed, then topping the tenant's own sample up to ``window`` waits (its weight
    #: falls as the own sample grows, to none once the window is full).
    prior_waits_s: tuple[float, ...] = ()
    #: The timer rule's last choice (what ``/admin/retention`` shows).
    last_choice: TimerChoice | None = None
    #: When the controller saw its first suspension (the tier's start: its age is scored).
    started_at: float | None = None

    def __post_init__(self) -> None:
        if self.estimator is None:
            self.estimator = rate_estimator(self.settings.estimator)
        if self.waits is None:
            self.waits = WaitWindow(self.settings.window)
        if self.cohort is None:
            self.cohort = SuspensionCohort(self.settings.window)
        if self.branch is None:
            self.branch = self.settings.initial_branch
        if self.scale is None and self.branch == "ttl":
            self.scale = 1.0
        if self.scale is not None:
            self.scale = check_scale(self.scale)
            self.branch = "ttl"

    # --- inputs ---------------------------------------------------------------------------

    def observe_suspension(self, now: float) -> None:
        assert self.estimator is not None and self.cohort is not None
        if self.started_at is None:
            self.started_at = now
        self.estimator.observe(now)
        self.cohort.suspend(now)
        self.reprice(now)

    def reprice(self, now: float) -> None:
        """Charge held copies ``alpha2`` at the lambda in use from ``now`` on."""
        lam, _ = self.lam(now)
        m = self.model
        self.rent.reprice(now, alpha2(lam, m.c2, m.w_ref_s, m.price.beta3))

    def observe_resume(self, now: float, wait_s: float) -> None:
        assert self.waits is not None and self.cohort is not None
        if self.waits.observe(wait_s):
            self.cohort.resume(now, wait_s)

    def sample(self, now: float) -> list[float]:
        """The waits the next re-choice scores."""
        assert self.waits is not None and self.cohort is not None
        observed = self.waits.samples()
        if self.settings.censored and len(self.cohort) >= self.settings.min_samples:
            return self.cohort.sample(now, observed, self.model.w_ref_s, seed=self.decisions)
        return observed

    # --- outputs --------------------------------------------------------------------------

    def lam(self, now: float) -> tuple[float, Literal["estimated", "pinned"]]:
        if self.settings.pinned_lambda is not None:
            return self.settings.pinned_lambda, "pinned"
        assert self.estimator is not None
        return rate_lower_bound(self.estimator, now, self.settings.lambda_z), "estimated"

    def host_ttl(self, now: float) -> float | None:
        """``t2`` at the lambda in use now (``None``: keep until resume): the timer of a
        context suspending at ``now`` if the price stayed as it is."""
        if self.branch != "ttl":
            return None
        lam, _ = self.lam(now)
        return timer_for_scale(self.model, self.scale, lam)

    def rent_limit(self, now: float) -> float | None:
        """The re-priced timer of a context suspending at ``now``: it expires when
        :attr:`rent` reaches this (``None``: retain branch, keep until resume)."""
        budget = scale_budget(self.model, self.scale) if self.branch == "ttl" else None
        if budget is None:
            return None
        return self.rent.limit_for(now, budget)

    def due(self, now: float) -> bool:
        last = self.last_decision_at
        return last is None or now - last >= self.settings.period_s

    def decide(self, now: float) -> RetentionDecision:
        """Re-choose the branch now (the caller calls this when :meth:`due`)."""
        assert self.branch is not None and self.waits is not None
        lam, source = self.lam(now)
        if self.settings.rule == "timer":
            return self._decide_timer(now, lam, source)
        decision = rechoose_branch(
            self.model,
            self.sample(now),
            lam,
            self.branch,
            now=now,
            margin=self.settings.margin,
            min_samples=self.settings.min_samples,
            evaluator=self.settings.evaluator,
            lam_source=source,
            seed=self.decisions,
        )
        self.branch = decision.branch
        self.scale = None if decision.branch == "retain" else 1.0
        self.last_decision_at = now
        self.decisions += 1
        self.switches += int(decision.changed)
        self.reprice(now)
        return decision

    def _decide_timer(
        self, now: float, lam: float, source: Literal["estimated", "pinned"]
    ) -> RetentionDecision:
        """The timer rule's re-choice: the scale of least expected cost, with hysteresis."""
        assert self.waits is not None
        st, crit = self.settings, self.model.lambda_crit
        observed = len(self.waits)
        sample, on, origin = self.sample(now), f"{observed} observed waits", "observed"
        if observed < st.min_samples and self.prior_waits_s:
            sample, origin = list(self.prior_waits_s), "calibration"
            on = f"{observed} observed waits < {st.min_samples}: the calibration sample"
        elif self.prior_waits_s and len(sample) < st.window:
            # The prior fades as the tenant's own sample fills the window, rather than
            # vanishing at min_samples: the first congested decision often comes when a few
            # hundred waits exist, all of them short ones (a long wait is still pending),
            # and the calibration sample is the only view of the tail it has.
            prior = _thin(self.prior_waits_s, st.window - len(sample))
            on = (
                f"{observed} observed waits ({len(sample)} scored) topped up to the window "
                f"with {len(prior)} of the calibration sample"
            )
            sample, origin = sample + prior, "observed+calibration"
        before = self.scale
        choice: TimerChoice | None = None
        if lam <= crit:
            reason = (
                f"uncongested: lambda {lam:.4g}/s <= lambda_crit {crit:.4g}/s, every scale "
                f"keeps every host copy; staying at {_scale_name(before)}"
            )
        elif len(sample) < (st.min_samples if origin == "observed" else 1):
            reason = (
                f"{len(sample)} waits < {st.min_samples} needed; staying at {_scale_name(before)}"
            )
        else:
            choice = choose_timer(
                self.model, sample, lam, evaluator=st.evaluator, resamples=st.resamples,
                seed=self.decisions, incumbent=before,
                mean_prior_s=self.model.w_ref_s if st.tail_prior else None,
                ages_s=self._ages(now),
            )  # fmt: skip
            self.last_choice = choice
            held = choice.cost_incumbent if choice.cost_incumbent is not None else math.inf
            detail = (
                f"at lambda {lam:.4g}/s ({lam / crit:.2f} x lambda_crit), t2 "
                f"{choice.t2 or 0:.0f} s, on {on} ({len(sample)} scored, {choice.resamples} "
                f"{st.evaluator} resamples): {_scale_name(choice.scale)} "
                f"{choice.cost:.4f} (sd {choice.cost_sd:.4f}), {_scale_name(before)} "
                f"{held:.4f}, retain {choice.cost_retain:.4f}, t2 {choice.cost_t2:.4f} "
                f"GPU-s/context"
            )
            if choice.scale != before and choice.cost < held * (1 - st.timer_margin):
                self.scale = choice.scale
                reason = f"switched {_scale_name(before)} -> {_scale_name(choice.scale)} {detail}"
            else:
                reason = f"kept {_scale_name(before)} (within {st.timer_margin:.0%}) {detail}"
        self.branch = "retain" if self.scale is None else "ttl"
        changed = self.scale != before
        self.last_decision_at = now
        self.decisions += 1
        self.switches += int(changed)
        self.reprice(now)
        return RetentionDecision(
            now, self.branch, lam, source, crit, timer_for_scale(self.model, self.scale, lam),
            None if choice is None else choice.cost_retain,
            None if choice is None else choice.cost_t2,
            len(sample), changed, reason, self.scale,
            None if choice is None else {**choice.to_dict(), "sample": _summary(sample, origin)},
        )  # fmt: skip

    def _ages(self, now: float) -> tuple[float, ...]:
        """The tier ages the suspensions from now to the horizon meet (evenly spaced
        points); none (the long run) without a horizon or once the tier is older."""
        horizon = self.settings.horizon_s
        if horizon is None or self.settings.evaluator != "steady":
            return ()
        age = max(0.0, now - (now if self.started_at is None else self.started_at))
        if age >= horizon:
            return ()
        step = (horizon - age) / _AGE_POINTS
        return tuple(age + step * (i + 0.5) for i in range(_AGE_POINTS))

    # --- persistence ----------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        assert self.estimator is not None and self.waits is not None
        assert self.cohort is not None
        return {
            "estimator": self.estimator.to_state(),
            "waits": self.waits.to_state(),
            "cohort": self.cohort.to_state(),
            "branch": self.branch,
            "last_decision_at": self.last_decision_at,
            "decisions": self.decisions,
            "switches": self.switches,
            "rent": self.rent.to_state(),
            "scale": self.scale,
            "started_at": self.started_at,
        }

    @classmethod
    def from_state(
        cls, model: RetentionModel, settings: OnlineSettings, state: Mapping[str, Any]
    ) -> OnlineController:
        branch = state.get("branch", settings.initial_branch)
        if branch not in ("retain", "ttl"):
            raise ValueError(f"branch must be 'retain' or 'ttl' in state, got {branch!r}")
        last = state.get("last_decision_at")
        return cls(
            model,
            settings,
            estimator=rate_estimator_from_state(state.get("estimator", {"kind": "window"})),
            waits=WaitWindow.from_state(state.get("waits", {"capacity": settings.window})),
            cohort=SuspensionCohort.from_state(state.get("cohort", {"capacity": settings.window})),
            branch=branch,
            last_decision_at=None if last is None else float(last),
            decisions=int(state.get("decisions", 0)),
            switches=int(state.get("switches", 0)),
            rent=RentClock.from_state(state.get("rent")),
            scale=check_scale(state.get("scale")) if branch == "ttl" else None,
            started_at=None if state.get("started_at") is None else float(state["started_at"]),
        )
