"""The retention rule (issue 26): a rent-budget scale of t2 by expected cost over resamples."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from tenure.service.policy.host_loss import steady_state_cost
from tenure.service.policy.rent import RentClock
from tenure.service.policy.retention import PriceVector
from tenure.service.policy.retention_control import OnlineController, OnlineSettings
from tenure.service.policy.retention_costs import RetentionModel
from tenure.service.policy.retention_rule import check_scale, choose_timer, timer_for_scale

MODEL = RetentionModel(PriceVector(0.0176, 0.02, 1.91), 425, 1800.0)
CRIT = MODEL.lambda_crit


def _heavy(n: int, seed: int = 1) -> list[float]:
    """Short approvals and a tail of hours (mean about W_ref), like the real human gaps."""
    rng = random.Random(seed)
    return [
        rng.expovariate(1 / 120) if rng.random() < 0.8 else rng.lognormvariate(8.4, 1.0)
        for _ in range(n)
    ]


def test_uncongested_keeps_every_copy_without_scoring() -> None:
    """Below lambda_crit every scale keeps every copy: retain, nothing resampled."""
    choice = choose_timer(MODEL, _heavy(300), 0.5 * CRIT)
    assert choice.scale is None and choice.timer_s is None and choice.resamples == 0


def test_heavy_tail_gets_a_timer_cheaper_than_both_seed_branches() -> None:
    """On a heavy tail at 3 x lambda_crit the chosen timer beats retain and t2 alike."""
    choice = choose_timer(MODEL, _heavy(2000), 3 * CRIT)
    assert choice.scale is not None and choice.timer_s is not None
    assert choice.cost < choice.cost_t2 and choice.cost < choice.cost_retain
    assert choice.timer_s == pytest.approx(choice.scale * (MODEL.t2(3 * CRIT) or 0))
    # Every candidate tried was scored; the choice is the cheapest of them.
    assert choice.cost == pytest.approx(min(c for _, c in choice.candidates))


def test_waits_longer_than_every_timer_keep_retain() -> None:
    """If every timer of the grid drops every copy, retain (the tie-break too) is chosen."""
    t2 = MODEL.t2(2 * CRIT) or 0.0
    choice = choose_timer(MODEL, [20 * t2] * 200, 2 * CRIT, incumbent=1.0)
    assert choice.scale is None
    assert choice.cost_incumbent is not None and choice.cost_incumbent > choice.cost


def test_the_unseen_tail_makes_retain_costly() -> None:
    """A sample that lacks the tail its prior mean says exists (collected over a short
    horizon) no longer makes keeping every copy look free."""
    short = [min(w, 900.0) for w in _heavy(1000)]
    lam = 2.5 * CRIT
    blind = choose_timer(MODEL, short, lam)
    told = choose_timer(MODEL, short, lam, mean_prior_s=MODEL.w_ref_s)
    assert told.cost_retain > blind.cost_retain
    assert told.scale is not None


def test_episode_score_is_deterministic_and_paired() -> None:
    """The same seed gives the same choice; the resamples are shared by every candidate."""
    waits = _heavy(600, seed=3)
    a = choose_timer(MODEL, waits, 3 * CRIT, evaluator="episode", resamples=3, seed=5)
    b = choose_timer(MODEL, waits, 3 * CRIT, evaluator="episode", resamples=3, seed=5)
    assert a == b


def test_online_controller_prices_the_rent_with_the_chosen_scale() -> None:
    """The rule's scale multiplies the rent budget: at a constant price, scale x t2."""
    settings = OnlineSettings(rule="timer", pinned_lambda=3 * CRIT, min_samples=50)
    ctl = OnlineController(MODEL, settings, prior_waits_s=tuple(_heavy(500)))
    decision = ctl.decide(0.0)
    assert decision.scale == ctl.scale and ctl.scale is not None
    assert decision.choice is not None and decision.choice["sample"]["source"] == "calibration"
    assert decision.choice["sample"]["n"] == 500
    t2 = MODEL.t2(3 * CRIT)
    assert t2 is not None
    limit = ctl.rent_limit(10.0)
    assert limit is not None
    clock = RentClock(ctl.rent.accrued, ctl.rent.at, ctl.rent.rate)
    assert (clock.expires_at(limit) or 0) - 10.0 == pytest.approx(ctl.scale * t2, rel=1e-9)
    assert ctl.host_ttl(10.0) == pytest.approx(timer_for_scale(MODEL, ctl.scale, 3 * CRIT))
    # The scale survives the state round trip.
    again = OnlineController.from_state(MODEL, settings, ctl.to_state())
    assert again.scale == ctl.scale


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), True, "2"])
def test_a_bad_scale_is_named(bad: object) -> None:
    with pytest.raises(ValueError, match="timer scale"):
        check_scale(bad)  # type: ignore[arg-type]


def test_the_first_congested_decision_scores_the_calibration_prior() -> None:
    """Issue 26 finding 5: the replay's first congested decision comes when a few hundred
    (short) waits exist, past ``min_samples``; the calibration sample must still count there,
    topping the own sample up to the window, or a learning controller is an online one."""
    settings = OnlineSettings(rule="timer", initial_branch="ttl", resamples=8)
    prior = _heavy(1500, seed=3)
    ctl = OnlineController(MODEL, settings, prior_waits_s=tuple(prior))
    bare = OnlineController(MODEL, settings)
    rng = random.Random(5)
    now, pending = 0.0, []
    while now < settings.period_s:  # 3 x lambda_crit for one period, every wait short
        now += rng.expovariate(3 * CRIT)
        for c in (ctl, bare):
            c.observe_suspension(now)
        pending.append(now + rng.expovariate(1 / 60))
        for at in [p for p in pending if p <= now]:
            pending.remove(at)
            for c in (ctl, bare):
                c.observe_resume(at, 60.0)
    assert ctl.waits is not None and len(ctl.waits) > settings.min_samples
    decision = ctl.decide(now)
    assert decision.lam > CRIT and decision.choice is not None, decision.reason
    sample = decision.choice["sample"]
    assert sample["source"] == "observed+calibration", decision.reason
    assert sample["n"] == settings.window  # the prior tops the own sample up to the window
    assert sample["max_s"] == max(prior)  # the prior's tail is seen
    own = bare.decide(now).choice
    assert own is not None and own["sample"]["source"] == "observed"
    # Short own waits alone see no tail: a different, shorter-held choice than with the prior.
    assert decision.choice["scale"] != own["scale"]


def test_the_rule_picks_the_cost_minimising_timer_of_a_known_law() -> None:
    """On a known two-point law (a short approval or a wait of hours) the rule's timer costs
    what the best timer of an independent dense sweep costs (steady state, exact formula)."""
    waits = [300.0] * 3000 + [5400.0] * 1000  # P(short) 0.75; the long ones never fit a timer
    lam = 2.5 * CRIT
    choice = choose_timer(MODEL, waits, lam, resamples=4)
    assert choice.timer_s is not None

    def exact(ttl: float | None) -> float:
        return steady_state_cost(waits, lam, ttl, MODEL.slots, MODEL.price)

    sweep = [exact(t) for t in range(60, 20_000, 20)] + [exact(None)]
    assert exact(choice.timer_s) <= min(sweep) * 1.005
    # The minimum is a timer that returns the short waits and drops the long ones.
    assert 300.0 <= choice.timer_s < 5400.0


def test_a_small_sample_widens_the_choice_and_regret_bounds_the_downside() -> None:
    """A small sample leaves more open (the choice's cost spread over the resamples is wider
    than on a large sample of the same law), and the regret criterion's pick has the least
    worst-case regret among the candidates, so no more than the expected-cost pick's."""
    lam = 3 * CRIT
    small = choose_timer(MODEL, _heavy(60, seed=7), lam, resamples=32)
    large = choose_timer(MODEL, _heavy(6000, seed=7), lam, resamples=32)
    assert small.cost_sd > 2 * large.cost_sd
    waits = _heavy(60, seed=7)
    mean = choose_timer(MODEL, waits, lam, resamples=32, criterion="mean")
    robust = choose_timer(MODEL, waits, lam, resamples=32, criterion="regret")
    assert robust.cost >= mean.cost - 1e-12  # the expected cost it gives up
    assert mean.regret_scale == robust.scale  # every choice carries the robust pick
    with pytest.raises(ValueError, match="criterion"):
        choose_timer(MODEL, waits, lam, criterion="median")  # type: ignore[arg-type]


def test_a_young_tier_makes_keeping_cheaper_and_ages_tend_to_steady_state() -> None:
    """Scored at the ages of a tier that started empty, holding every copy of a heavy tail
    costs less than in the long run; at ages far beyond every wait the score is steady."""
    waits = _heavy(2000)
    lam = 2 * CRIT
    steady = choose_timer(MODEL, waits, lam, resamples=4)
    young = choose_timer(MODEL, waits, lam, resamples=4, ages_s=(600.0, 1800.0))
    old = choose_timer(MODEL, waits, lam, resamples=4, ages_s=(1e9,))
    assert young.cost_retain < steady.cost_retain
    assert old.cost_retain == pytest.approx(steady.cost_retain)
    with pytest.raises(ValueError, match="ages_s"):
        choose_timer(MODEL, waits, lam, ages_s=(-1.0,))


def test_the_controller_scores_up_to_its_horizon_and_keeps_its_start() -> None:
    """With a horizon the controller scores the tier's ages from its first suspension to the
    horizon (none past it); the start survives the state round trip."""
    settings = OnlineSettings(
        rule="timer", pinned_lambda=3 * CRIT, min_samples=50, horizon_s=7200.0
    )
    ctl = OnlineController(MODEL, settings, prior_waits_s=tuple(_heavy(500)))
    ctl.observe_suspension(100.0)
    assert ctl.started_at == 100.0
    young = ctl.decide(1000.0)
    again = OnlineController.from_state(MODEL, settings, ctl.to_state())
    assert again.started_at == 100.0
    steady = OnlineController(
        MODEL, replace(settings, horizon_s=None), prior_waits_s=tuple(_heavy(500))
    )
    steady.observe_suspension(100.0)
    long_run = steady.decide(1000.0)
    assert young.choice is not None and long_run.choice is not None
    assert young.choice["cost_retain"] < long_run.choice["cost_retain"]
    again.prior_waits_s = tuple(_heavy(500))  # the prior is configuration, not state
    past = again.decide(100.0 + 8000.0)
    assert past.choice is not None
    assert past.choice["cost_retain"] == pytest.approx(long_run.choice["cost_retain"], rel=0.05)
    with pytest.raises(ValueError, match="horizon_s"):
        OnlineSettings(horizon_s=0.0)
