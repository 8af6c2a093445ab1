"""The host tier as a loss system, the branch choice per wait family, and both controllers."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from tenure.service.policy.host_loss import (
    HostSlots,
    episode_cost,
    erlang_b,
    poisson_arrivals,
    steady_state_cost,
)
from tenure.service.policy.platforms import PLATFORMS
from tenure.service.policy.retention_control import (
    OneShotController,
    OnlineController,
    OnlineSettings,
    rechoose_branch,
)
from tenure.service.policy.retention_costs import (
    Branch,
    RetentionModel,
    branch_costs,
    choose_regime,
)
from tenure.service.policy.waits import SuspensionCohort, WaitWindow
from tenure.service.replay.ttl_families import synthetic_family

PRICE = PLATFORMS["h100-nvl"].price
MODEL = RetentionModel(PRICE, 425, 1800.0)
CRIT = MODEL.lambda_crit


def _waits(family: str, n: int = 4000, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(w) for w in synthetic_family(family, 1800.0).sample(n, rng)]


# --- the loss system ------------------------------------------------------------------------


def test_admission_is_at_arrival_and_residents_are_never_displaced() -> None:
    slots = HostSlots(2)
    assert slots.admit(0.0, 100.0) and slots.admit(1.0, 10.0)
    assert not slots.admit(2.0, 1.0)  # full: the newcomer is refused, nobody is evicted
    assert slots.occupancy(5.0) == 2
    assert slots.admit(11.0, 5.0)  # the 10 s resident left at t = 11: its slot is free
    assert not slots.admit(12.0, 1.0)


def test_episode_cost_charges_beta2_per_host_hit_and_beta3_otherwise() -> None:
    # c2 = 1: the first is admitted and resumes (hit), the second finds the slot taken
    # (rejected), the third is admitted but outlives its timer (expired).
    result = episode_cost([0.0, 1.0, 100.0], [50.0, 5.0, 80.0], 60.0, 1, PRICE)
    assert (result.host_hits, result.rejected, result.expired) == (1, 1, 1)
    assert result.cost == pytest.approx((PRICE.beta2 + 2 * PRICE.beta3) / 3)


def test_erlang_b_known_values() -> None:
    assert erlang_b(1, 1.0) == pytest.approx(0.5)
    assert erlang_b(2, 1.0) == pytest.approx(0.2)
    assert erlang_b(425, 1.0) < 1e-12
    assert erlang_b(425, 850.0) == pytest.approx(0.5, abs=0.02)  # 2 x capacity: half blocked


def test_steady_state_cost_matches_a_long_replay() -> None:
    """The Erlang-B evaluator agrees with the finite replay once the start-up is forgotten."""
    rng = random.Random(4)
    waits = _waits("mixture", 40_000, seed=4)
    lam = 2 * CRIT
    at, arrivals = 0.0, []
    for _ in waits:
        at += rng.expovariate(lam)
        arrivals.append(at)
    t2 = MODEL.t2(lam)
    for ttl in (None, t2):
        full = episode_cost(arrivals, waits, ttl, 425, PRICE)
        warm = episode_cost(arrivals[:8000], waits[:8000], ttl, 425, PRICE)
        # cost of the 32,000 after a warm-up of 8,000 (the episode is deterministic)
        tail = (full.cost * 40_000 - warm.cost * 8000) / 32_000
        assert steady_state_cost(waits, lam, ttl, 425, PRICE) == pytest.approx(tail, rel=0.03)


# --- the branch choice per family -----------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "branch"), [("lognormal", "retain"), ("exponential", "retain"), ("mixture", "ttl")]
)
def test_seed_calibration_picks_the_seeds_branch_per_family(family: str, branch: str) -> None:
    """Replaying the calibration sample as an episode (the seed's method) at 3 x lambda_crit."""
    controller = OneShotController(
        MODEL, lam=3 * CRIT, calibration_waits_s=_waits(family), evaluator="episode"
    )
    assert controller.branch == branch
    assert controller.decision.reason.startswith("calibrated once")
    if branch == "ttl":
        assert controller.host_ttl() == pytest.approx(MODEL.t2(3 * CRIT))
        assert controller.host_ttl(2 * CRIT) == pytest.approx(MODEL.t2(2 * CRIT))
    else:
        assert controller.host_ttl() is None


def test_memoryless_waits_never_favour_expiry_in_the_long_run() -> None:
    """Exponential waits: expiry frees slots exactly as fast as it forfeits hits, so in steady
    state it can only lose (the mean-field alpha2 charge alone would prefer it)."""
    waits = _waits("exponential", 20_000)
    for load in (1.5, 2.0, 3.0):
        costs = branch_costs(MODEL, waits, load * CRIT, evaluator="steady")
        assert costs.retain <= costs.ttl * 1.002


def test_the_two_evaluators_disagree_on_lognormal_waits() -> None:
    """A finite episode from an empty tier favours retention; the long run favours expiry."""
    waits = _waits("lognormal")
    episode = branch_costs(MODEL, waits, 2 * CRIT, evaluator="episode")
    steady = branch_costs(MODEL, waits, 2 * CRIT, evaluator="steady")
    assert episode.retain < episode.ttl
    assert steady.ttl < steady.retain


def test_no_congestion_means_no_choice() -> None:
    costs = branch_costs(MODEL, _waits("mixture", 500), 0.5 * CRIT)
    assert costs.t2 is None and costs.retain == costs.ttl
    assert costs.retain == pytest.approx(PRICE.beta2, rel=1e-6)


def test_choose_regime_scores_in_the_loss_system() -> None:
    lam = 3 * CRIT
    t2 = MODEL.t2(lam)
    assert t2 is not None
    assert choose_regime([0.1 * t2] * 50, lam, PRICE, 425, 1800.0).regime == "retain"
    # All waits far beyond t2: expiring every copy turns every resume into a recompute, so
    # retain wins (the mean-field charge would have chosen ttl here).
    assert choose_regime([20 * t2] * 50, lam, PRICE, 425, 1800.0).regime == "retain"
    mixture = choose_regime(_waits("mixture"), lam, PRICE, 425, 1800.0)
    assert mixture.regime == "ttl" and mixture.host_ttl_s == pytest.approx(t2)
    assert choose_regime([], lam, PRICE, 425, 1800.0).samples == 0


# --- hysteresis and the online controller ----------------------------------------------------


def test_rechoose_keeps_the_incumbent_inside_the_margin() -> None:
    waits = _waits("exponential", 4000)  # the branches are within ~1% here
    costs = branch_costs(MODEL, waits, 3 * CRIT)
    assert abs(costs.ttl - costs.retain) < 0.02 * costs.retain
    worse: Branch = "ttl" if costs.ttl > costs.retain else "retain"
    better: Branch = "retain" if worse == "ttl" else "ttl"
    kept = rechoose_branch(MODEL, waits, 3 * CRIT, worse, now=0.0, margin=0.05)
    assert kept.branch == worse and not kept.changed and "within the 5% margin" in kept.reason
    moved = rechoose_branch(MODEL, waits, 3 * CRIT, worse, now=0.0, margin=0.0)
    assert moved.branch == better and moved.changed and moved.reason.startswith("switched")
    stay = rechoose_branch(MODEL, waits, 3 * CRIT, better, now=0.0, margin=0.0)
    assert stay.branch == better and "costs" in stay.reason and "more" in stay.reason
    calm = rechoose_branch(MODEL, waits, 0.5 * CRIT, "ttl", now=0.0)
    assert calm.branch == "ttl" and "uncongested" in calm.reason and calm.host_ttl_s is None
    few = rechoose_branch(MODEL, waits[:10], 3 * CRIT, "retain", now=0.0, min_samples=100)
    assert few.branch == "retain" and "10 observed waits < 100" in few.reason
    with pytest.raises(ValueError, match="margin"):
        rechoose_branch(MODEL, waits, 3 * CRIT, "ttl", now=0.0, margin=1.5)


def _drive(
    controller: OnlineController, family: str, lam: float, start: float, end: float, seed: int
) -> list[tuple[float, float]]:
    """Suspensions at ``lam`` on [start, end); resumes fed back in time order."""
    rng = random.Random(seed)
    waits = iter(_waits(family, 20_000, seed))
    pending: list[tuple[float, float]] = []
    at = start
    while True:
        at += rng.expovariate(lam)
        if at >= end:
            break
        pending.sort()
        while pending and pending[0][0] <= at:
            back, wait = pending.pop(0)
            controller.observe_resume(back, wait)
        controller.observe_suspension(at)
        if controller.due(at):
            controller.decide(at)
        wait = next(waits)
        pending.append((at + wait, wait))
    return pending


def test_online_controller_moves_to_ttl_after_the_waits_change_and_does_not_flap() -> None:
    settings = OnlineSettings(period_s=900.0, margin=0.05)
    controller = OnlineController(MODEL, settings)
    # Lognormal waits at 0.5 x crit for 4 h: uncongested, nothing to choose.
    _drive(controller, "lognormal", 0.5 * CRIT, 0.0, 4 * 3600.0, seed=1)
    assert (controller.branch, controller.switches) == ("retain", 0)
    # The mixture at 3 x crit: expiry pays, and the controller finds it.
    _drive(controller, "mixture", 3 * CRIT, 4 * 3600.0, 10 * 3600.0, seed=2)
    assert controller.branch == "ttl"
    assert 1 <= controller.switches <= 2
    ttl = controller.host_ttl(10 * 3600.0)
    assert ttl is not None and ttl == pytest.approx(MODEL.t2(3 * CRIT), rel=0.15)


def test_online_controller_state_round_trips() -> None:
    settings = OnlineSettings(estimator="window:600")
    controller = OnlineController(MODEL, settings)
    _drive(controller, "mixture", 3 * CRIT, 0.0, 2 * 3600.0, seed=3)
    again = OnlineController.from_state(MODEL, settings, controller.to_state())
    now = 2 * 3600.0
    assert again.branch == controller.branch
    assert again.lam(now) == controller.lam(now)
    assert again.sample(now) == controller.sample(now)
    assert again.decide(now).to_dict() == controller.decide(now).to_dict()


def test_pinned_lambda_overrides_the_estimate() -> None:
    controller = OnlineController(
        MODEL, OnlineSettings(pinned_lambda=3 * CRIT, initial_branch="ttl")
    )
    assert controller.lam(0.0) == (3 * CRIT, "pinned")
    assert controller.host_ttl(0.0) == pytest.approx(MODEL.t2(3 * CRIT))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"period_s": 0.0}, "period_s"),
        ({"margin": -0.1}, "margin"),
        ({"min_samples": 0}, "min_samples"),
        ({"window": 0}, "window"),
        ({"estimator": "median"}, "rate estimator"),
        ({"pinned_lambda": -1.0}, "lambda"),
        ({"pinned_lambda": math.inf}, "lambda"),
    ],
)
def test_online_settings_name_the_bad_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        OnlineSettings(**kwargs)  # type: ignore[arg-type]


def test_censored_cohort_sees_long_waits_before_they_come_back() -> None:
    """Ten contexts suspended 1 h ago, five resumed after 60 s: the five pending ones are
    known to wait > 1 h, and the cohort says so; the resumes alone say every wait is 60 s."""
    cohort = SuspensionCohort(100)
    window = WaitWindow(100)
    for i in range(10):
        cohort.suspend(float(i))
    for i in range(5):
        assert cohort.resume(i + 60.0, 60.0)
        window.observe(60.0)
    assert not cohort.resume(500.0, 1.0)  # nothing suspended at t = 499
    assert cohort.pending() == 5
    sample = cohort.sample(3600.0 + 10, window.samples(), tail_mean_s=1800.0)
    assert sorted(sample)[:5] == [60.0] * 5
    assert all(w > 3590.0 for w in sorted(sample)[5:])
    again = SuspensionCohort.from_state(cohort.to_state())
    assert again.sample(3610.0, window.samples(), 1800.0) == sample


def test_the_episode_score_averages_arrival_streams_so_the_waits_decide() -> None:
    """The arrival stream is the scorer's own randomness: one stream's score of a sample moves
    with its seed about as much as the sample itself; the mean over the default streams does
    not, and its first stream is the single-stream score."""
    waits = _waits("mixture", 1000, seed=3)
    lam = 2 * CRIT

    def gap(seed: int, draws: int) -> float:
        costs = branch_costs(MODEL, waits, lam, evaluator="episode", seed=seed, draws=draws)
        return (costs.ttl - costs.retain) / costs.retain

    single = [gap(seed, 1) for seed in range(8)]
    averaged = [gap(seed, 16) for seed in range(8)]
    assert float(np.std(averaged)) < 0.4 * float(np.std(single))
    one = branch_costs(MODEL, waits, lam, evaluator="episode", seed=5, draws=1)
    arrivals = poisson_arrivals(len(waits), lam, 5)
    assert one.retain == episode_cost(arrivals, waits, None, 425, PRICE).cost
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="draws"):
            branch_costs(MODEL, waits, lam, evaluator="episode", draws=bad)  # type: ignore[arg-type]
