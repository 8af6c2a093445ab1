"""The hint-free gap learner: what it recovers from samples, tenant isolation, ends, the gate."""

from __future__ import annotations

import math
import pickle
import random
from statistics import NormalDist

import pytest

from tenure.service.policy.gap_learner import GapLearner, tenant_of
from tests.policy.harness import Harness


def feed(learner: GapLearner, session: str, gaps: list[float], start: float = 0.0) -> float:
    """One session: a request, then for each gap an idle spell of that length and a request."""
    now = start
    learner.on_start(session, now)
    learner.on_idle(session, now + 1.0)
    now += 1.0
    for gap in gaps:
        now += gap
        learner.on_start(session, now)
        now += 1.0
        learner.on_idle(session, now)
    return now


def test_tenant_of_reads_the_scope() -> None:
    assert tenant_of("acme/s1") == "acme"
    assert tenant_of("s1") == ""
    assert tenant_of("acme/team/s1") == "acme"


@pytest.mark.parametrize("q", [0.25, 0.5, 0.9])
def test_recovers_a_log_normal_quantiles_from_samples(q: float) -> None:
    rng = random.Random(7)
    truth = NormalDist(math.log(40.0), 1.2)
    learner = GapLearner(model="tenant", prior_weight=0.0)
    for i in range(400):  # many sessions of two gaps: the tenant histogram carries it
        feed(learner, f"s{i}", [math.exp(truth.samples(1, seed=rng.random())[0]) for _ in range(2)])
    expected = math.exp(truth.inv_cdf(q))
    # Bins are 2**(1/4) wide (19%); sampling noise of 800 draws adds a few percent.
    assert learner.quantile("fresh", q) == pytest.approx(expected, rel=0.15)


def test_bimodal_gaps_beat_a_single_log_normal() -> None:
    """Agent gaps: most in seconds (tool calls), some in minutes (a human). The learner keeps
    both modes; a log-normal fitted to the same samples puts its quantiles between them."""
    rng = random.Random(3)
    samples: list[float] = []
    mixture = GapLearner(model="tenant", prior_weight=0.0)
    lognormal = GapLearner(model="lognormal")
    for i in range(300):
        gaps = [rng.uniform(5.0, 12.0) if rng.random() < 0.7 else rng.uniform(200.0, 600.0)]
        samples.extend(gaps)
        feed(mixture, f"s{i}", gaps)
        feed(lognormal, f"s{i}", gaps)
    samples.sort()
    worst_mix = worst_ln = 0.0
    for q in (0.3, 0.5, 0.65, 0.8, 0.95):
        true = samples[int(q * len(samples))]
        worst_mix = max(worst_mix, abs(math.log(mixture.quantile("x", q) / true)))
        worst_ln = max(worst_ln, abs(math.log(lognormal.quantile("x", q) / true)))
    # log-ratio errors: 0.2 is within one 19% bin; the log-normal misses by a factor of two+.
    assert worst_mix < 0.2 and worst_ln > math.log(2.0), (worst_mix, worst_ln)


def test_one_tenants_gaps_never_change_anothers_prediction() -> None:
    alone, shared = GapLearner(), GapLearner()
    for learner in (alone, shared):
        for i in range(20):
            feed(learner, f"a/s{i}", [8.0, 9.0, 10.0], start=10.0 * i)
        feed(learner, "a/probe", [9.0], start=300.0)
    for i in range(200):  # a noisy neighbour with hour-long gaps and one-shot sessions
        feed(shared, f"b/s{i}", [3600.0, 7200.0], start=10.0 * i)
        shared.on_start(f"b/one{i}", 5000.0 + i)
        shared.on_idle(f"b/one{i}", 5001.0 + i)
    for learner in (alone, shared):  # the same late event for both: time passes alike
        learner.on_start("c/late", 1e6)
    assert shared.quantile("b/s0", 0.5) > 1000.0  # b learned its own
    for session in ("a/probe", "a/s3", "a/new"):
        for q in (0.25, 0.5, 0.9):
            assert shared.quantile(session, q) == alone.quantile(session, q)
        assert shared.distribution(session) == alone.distribution(session)
        assert shared.return_probability(session) == alone.return_probability(session)
    assert shared.quantile("a/probe", 0.5) < 20.0


def test_context_separates_bursts_from_pauses() -> None:
    """Gaps follow the previous gap (a tool loop continues, a pause is followed by a pause):
    the prediction after a short gap is shorter than after a long one, with no stop reason."""
    rng = random.Random(11)
    learner = GapLearner()
    for i in range(150):
        gaps: list[float] = []
        short = rng.random() < 0.5
        for _ in range(6):
            if rng.random() < 0.15:
                short = not short
            gaps.append(rng.uniform(3.0, 10.0) if short else rng.uniform(300.0, 900.0))
        feed(learner, f"s{i}", gaps)
    feed(learner, "after-short", [5.0, 6.0])
    feed(learner, "after-long", [500.0, 600.0])
    assert learner.quantile("after-short", 0.5) < 20.0 < 200.0 < learner.quantile("after-long", 0.5)


def test_learns_that_one_shot_sessions_end_and_long_ones_do_not() -> None:
    learner = GapLearner(end_min_s=600.0)
    now = 0.0
    for i in range(100):  # 90% of sessions are one call; the rest go on for five
        if i % 10:
            learner.on_start(f"one{i}", now)
            learner.on_idle(f"one{i}", now + 1.0)
        else:
            feed(learner, f"long{i}", [20.0, 30.0, 25.0, 20.0], start=now)
        now += 200.0
    learner.on_start("late", now + 2000.0)  # everyone idle since is past the threshold
    assert learner.return_probability("one1") < 0.3
    learner.on_start("fresh", now + 2000.0)
    assert learner.return_probability("fresh", pending_turn=True) < 0.3  # a new first call
    learner.on_start("two-calls", now + 2000.0)
    learner.on_idle("two-calls", now + 2001.0)
    learner.on_start("two-calls", now + 2010.0)
    learner.on_idle("two-calls", now + 2011.0)
    assert learner.return_probability("two-calls") > 0.8  # every long session came back
    # After five calls half the sessions seen so far ended (the long ones end there).
    assert 0.3 < learner.return_probability("long0") < 0.7


def test_a_session_counted_as_ended_that_returns_moves_the_count() -> None:
    learner = GapLearner(end_min_s=100.0, return_weight=0.0)
    for i in range(5):
        feed(learner, f"warm{i}", [10.0, 10.0])
    learner.on_start("s", 0.0)
    learner.on_idle("s", 1.0)
    learner.on_start("other", 500.0)  # sweeps: s idle 499 s > 100 s counts as ended
    assert learner.return_probability("s") < 1.0
    learner.on_start("s", 600.0)
    assert learner.return_probability("s") == 1.0  # every session after one turn came back


def test_queries_change_nothing_and_bad_input_is_refused() -> None:
    learner = GapLearner()
    for i in range(10):
        feed(learner, f"s{i}", [5.0, 50.0, 500.0])
    state = pickle.dumps(vars(learner))
    learner.quantile("s1", 0.5)
    learner.quantile("nobody", 0.9, pending_turn=True)
    learner.return_probability("s1")
    learner.distribution("s2")
    assert pickle.dumps(vars(learner)) == state
    with pytest.raises(ValueError, match="q must be"):
        learner.quantile("s1", 1.0)
    with pytest.raises(ValueError, match="model must be"):
        GapLearner(model="gamma")
    with pytest.raises(ValueError, match="gap_model"):
        Harness("tenure-tags-off", 10, {"gap_model": 7.0})


def test_distribution_sums_to_one_and_own_gaps_pull_the_prediction() -> None:
    learner = GapLearner(session_weight=2.0)
    for i in range(30):
        feed(learner, f"s{i}", [100.0, 120.0])
    feed(learner, "fast", [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0])
    assert sum(learner.distribution("fast")) == pytest.approx(1.0)
    assert learner.quantile("fast", 0.5) < 10.0 < learner.quantile("s0", 0.5)


def teach(h: Harness) -> None:
    """A tenant's history, in sessions that store nothing: ten one-shot calls, three sessions
    of four calls 10 s apart, one of four calls 300 s apart; then everyone goes quiet."""
    for i in range(10):
        h.turn(f"one{i}", 0, float(i))
    for i in range(3):
        for k in range(4):
            h.turn(f"loop{i}", 0, 20.0 + 11.0 * k)
    for k in range(4):
        h.turn("slowpoke", 0, 100.0 + 301.0 * k)


def test_tags_off_gate_wakes_each_session_by_what_it_showed() -> None:
    """No hints: of two idle residents, the one whose own gaps are long yields to a newcomer;
    the one in a quick loop is kept (the old rule, one horizon for all, protects both)."""
    for learn, slow_kept in ((1.0, 3), (0.0, 8)):
        h = Harness("tenure-tags-off", 20, {"learn_gaps": learn, "learn_ends": 0.0})
        teach(h)
        t = 5000.0
        h.turn("fast", 4, t)
        h.turn("fast", 4, t + 11.0)
        h.turn("slowpoke", 8, t + 12.0)
        h.turn("fast", 4, t + 23.0)
        result = h.turn("new", 5, t + 25.0)
        assert result.admitted == bool(learn)
        assert h.resident("fast") == 12 and h.resident("slowpoke") == slow_kept


@pytest.mark.parametrize("end_threshold", [0.5, 0.0])
def test_a_probably_ended_resident_yields_to_a_returning_newcomer(end_threshold: float) -> None:
    h = Harness("tenure-tags-off", 20, {"end_threshold": end_threshold})
    teach(h)
    t = 5000.0  # all taught sessions idle past the end threshold: one-shots counted as ended
    h.turn("first-call", 10, t)  # after one call a session of this tenant has likely ended
    h.turn("loop", 5, t + 2.0)
    h.turn("loop", 5, t + 13.0)  # the tier is full
    result = h.turn("loop", 5, t + 25.0)  # a third call: this kind comes back
    if end_threshold > 0:
        assert result.admitted and h.resident("first-call") == 5
    else:  # ends ignored: first-call wakes ~10 s after its call, before loop's next: kept
        assert not result.admitted and h.resident("first-call") == 10


@pytest.mark.parametrize("end_threshold", [0.5, 0.0])
def test_a_probably_ended_newcomer_takes_no_room_from_a_returning_resident(
    end_threshold: float,
) -> None:
    h = Harness("tenure-tags-off", 20, {"end_threshold": end_threshold})
    teach(h)
    t = 5000.0
    h.turn("slowpoke", 20, t)  # back after 4,000 s: it has shown long gaps, and comes back
    result = h.turn("first-call", 5, t + 20.0)
    if end_threshold > 0:  # a one-shot call wakes "never": it may not displace slowpoke
        assert not result.admitted and h.resident("slowpoke") == 20
    else:  # ends ignored: its wake-up (~10 s) is sooner than slowpoke's (minutes): admitted
        assert result.admitted and h.resident("slowpoke") == 15
