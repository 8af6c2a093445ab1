"""tenure-density: victims and refusals by work saved per block-second (issue 25).

Each test is a situation where the density order decides differently from at least one naive
rule (wake-up order, whole sessions, recency), so it fails if the order is lost.
"""

from __future__ import annotations

import math
import random

import pytest

from tenure.service.policy import EvictionClass, Run, SessionHint
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.gap_spread import GapSpread, HitYield
from tests.policy.harness import Harness


def _density(h: Harness) -> TenureDensity:
    policy = h.tier.policy
    assert isinstance(policy, TenureDensity)
    return policy


def test_two_short_sessions_waking_soon_take_the_slot_of_one_long_one_waking_late() -> None:
    h = Harness("tenure-density", 20)
    h.turn("long", 20, 0.0, gap=1000.0)
    assert h.resident("long") == 20
    first = h.turn("a", 10, 1.0, gap=10.0)
    assert first.admitted and {v.cls for v in first.victims} == {EvictionClass.UTILITY}
    # Only what "a" needed left, from the tail: the long session's head stays.
    assert h.resident("long") == 10
    assert h.tier.is_resident(h.seg("long"), 0) and not h.tier.is_resident(h.seg("long"), 10)
    second = h.turn("b", 10, 2.0, gap=10.0)
    assert second.admitted
    assert h.resident("long") == 0 and h.resident("a") == 10 and h.resident("b") == 10


def test_a_long_session_waking_late_is_refused_rather_than_displacing_short_ones() -> None:
    h = Harness("tenure-density", 20)
    h.turn("a", 10, 0.0, gap=10.0)
    h.turn("b", 10, 0.0, gap=12.0)
    result = h.turn("long", 20, 1.0, gap=1000.0)
    assert not result.admitted and result.victims == ()
    assert h.resident("a") == 10 and h.resident("b") == 10


def test_the_head_of_a_store_is_kept_when_its_whole_does_not_fit() -> None:
    """Offered in prefill chunks (as vLLM offers), the head displaces a less dense resident;
    the tail, for which only denser residents are left, is refused: a prefix, no hole."""
    h = Harness("tenure-density", 30)
    h.turn("far", 10, 0.0, gap=5000.0)
    h.turn("near", 20, 0.0, gap=5.0)
    seg = h.seg("new")
    h.tier.request_start("new", 1.0)
    h.tier.hint("new", SessionHint(expected_gap_s=60.0), 1.0)
    head = h.tier.store([Run(seg, 0, 10)], "new", 1.0)
    tail = h.tier.store([Run(seg, 10, 20)], "new", 1.1)
    assert head.admitted and h.resident("far") == 0
    assert not tail.admitted
    assert h.resident("new") == 10 and h.resident("near") == 20
    assert h.tier.is_resident(seg, 0) and not h.tier.is_resident(seg, 10)


def test_deep_blocks_are_worth_more_per_byte_than_a_sooner_shallow_session() -> None:
    """Wake-up order would evict the deep session (it wakes later); per block it saves three
    times the work of a shallow one (attention over its long prefix), so it stays."""
    h = Harness("tenure-density", 50, {"depth_scale_blocks": 10.0})
    h.turn("deep", 40, 0.0, gap=120.0)
    h.turn("shallow", 10, 0.0, gap=100.0)
    result = h.turn("new", 10, 1.0, gap=20.0)
    assert result.admitted
    assert h.resident("shallow") == 0 and h.resident("deep") == 40
    # Without the depth term the same situation goes by the gap: the deep one loses 10.
    g = Harness("tenure-density", 50)
    g.turn("deep", 40, 0.0, gap=120.0)
    g.turn("shallow", 10, 0.0, gap=100.0)
    g.turn("new", 10, 1.0, gap=20.0)
    assert g.resident("shallow") == 10 and g.resident("deep") == 30


def test_a_session_past_every_gap_like_it_goes_first_as_overdue() -> None:
    """Learned spread: gaps after a 10 s prediction were 8-12 s; a session silent for 100 s has
    outlived them all (density 0) and goes before one that will wake in an hour."""
    h = Harness("tenure-density", 20)
    spread = _density(h).spread
    for i in range(20):
        spread.observe(GapSpread.bucket(10.0), 8.0 + 0.2 * i)
    h.turn("stale", 10, 0.0, gap=10.0)
    h.turn("far", 10, 0.0, gap=3600.0)
    result = h.turn("new", 10, 100.0, gap=30.0)
    assert result.admitted and {v.cls for v in result.victims} == {EvictionClass.OVERDUE}
    assert h.resident("stale") == 0 and h.resident("far") == 10
    # Before it has outlived its bucket (at 5 s) it is the denser of the two: "far" goes.
    g = Harness("tenure-density", 20)
    for i in range(20):
        _density(g).spread.observe(GapSpread.bucket(10.0), 8.0 + 0.2 * i)
    g.turn("stale", 10, 0.0, gap=10.0)
    g.turn("far", 10, 0.0, gap=3600.0)
    g.turn("new", 10, 5.0, gap=30.0)
    assert g.resident("stale") == 10 and g.resident("far") == 0


def _lookup_turn(h: Harness, session: str, now: float, gpu_hit: int) -> int:
    """A returning request: start, lookup from the GPU hit on, finish; returns the host hit."""
    seg = h.seg(session)
    length = h.length[session]
    h.tier.request_start(session, now)
    hit = h.tier.lookup([Run(seg, gpu_hit, length)], session=session, now=now)
    h.tier.access([Run(seg, 0, length)], now + 1.0)
    h.tier.hint(session, SessionHint(expected_gap_s=30.0), now + 1.0)
    return hit


def test_lookups_teach_the_yield_of_a_held_copy_by_clock_distance() -> None:
    h = Harness("tenure-density", 1000)
    h.turn("s", 10, 0.0, gap=30.0)
    for k in range(8):
        # The GPU still held the first 6 blocks: the lookup starts past them and finds 4.
        assert _lookup_turn(h, "s", 100.0 * (k + 1), gpu_hit=6) == 4
    yields = _density(h).yields
    assert yields.of(0.0) == pytest.approx(0.4)  # nothing computed in between: distance 0
    assert yields.of(1000.0) == 1.0  # an unseen distance keeps the prior


def test_the_clock_counts_blocks_computed_past_the_gpu_and_host_hits() -> None:
    h = Harness("tenure-density", 1000)
    seg = h.seg("s")
    h.tier.request_start("s", 0.0)
    assert h.tier.lookup([Run(seg, 3, 20)], session="s", now=0.0) == 0
    h.tier.store([Run(seg, 0, 20)], "s", 1.0)
    h.tier.access([Run(seg, 0, 20)], 2.0)
    h.tier.request_start("s", 10.0)
    assert h.tier.lookup([Run(seg, 5, 30)], session="s", now=10.0) == 15
    policy = _density(h)
    assert policy.clock == 17 + 10
    assert policy.rate(10.0) == pytest.approx(10 / 10.0)


def test_copies_the_gpu_serves_are_worth_nothing_once_lookups_show_it() -> None:
    """Lookups at short clock distances loaded none of the copy (the GPU still held it): a
    session waking soon is then worth less than one waking later, past the GPU's reach."""
    h = Harness("tenure-density", 20)
    policy = _density(h)
    for _ in range(10):
        for k in range(100):  # every bin up to ~10 blocks
            policy.yields.observe(0.1 * k, 0.0)
        for d in (300.0, 600.0, 1200.0, 2400.0):
            policy.yields.observe(d, 1.0)
    # About 2 blocks computed per second: "later" will be ~600 blocks away when it is back.
    policy.clock = 1000
    policy._ticks.extend([(-500.0, 0), (0.0, 1000)])
    h.turn("soon", 10, 0.0, gap=1.0)
    h.turn("later", 10, 0.0, gap=300.0)
    h.turn("new", 10, 1.0, gap=300.0)
    assert h.resident("soon") == 0 and h.resident("later") == 10


def test_a_declared_last_turn_still_reclaims() -> None:
    h = Harness("tenure-density", 50)
    h.turn("s", 10, 0.0, gap=10.0)
    h.turn("s", 5, 20.0, gap=10.0)
    assert h.resident("s") == 15
    h.turn("s", 5, 40.0, last=True)
    assert h.resident("s") == 0
    assert h.tier.counters["evicted_blocks_reclaim"] == 20


def test_a_last_turn_store_displaces_no_live_resident() -> None:
    h = Harness("tenure-density", 20)
    h.turn("a", 20, 0.0, gap=3600.0)
    result = h.turn("end", 10, 1.0, last=True)
    assert not result.admitted and h.resident("a") == 20


def test_an_admitted_session_is_never_a_victim() -> None:
    h = Harness("tenure-density", 20)
    h.turn("busy", 10, 0.0, gap=3600.0)
    h.tier.request_start("busy", 5.0)  # its next request is in flight
    h.tier.request_admitted("busy", 5.5)  # and the engine runs it
    h.turn("idle", 10, 1.0, gap=3600.0)
    result = h.turn("new", 10, 6.0, gap=5.0)
    assert result.admitted
    assert h.resident("busy") == 10 and h.resident("idle") == 0
    # A still denser store takes the idle newcomer's room, never the running session's.
    assert h.turn("newer", 10, 7.0, gap=1.0).admitted
    assert h.resident("busy") == 10 and h.resident("new") == 0


def _queued_case(params: dict[str, float] | None = None) -> Harness:
    """A shallow session queued for admission (its next gap expected long) holds the tier;
    a deep one, due back in seconds, offers its context."""
    h = Harness("tenure-density", 30, {"depth_scale_blocks": 10.0, **(params or {})})
    h.turn("queued", 10, 0.0, gap=3600.0)
    h.turn("deep", 20, 0.0, gap=5.0)
    h.tier.request_start("queued", 10.0)  # waits in the engine's queue from now
    seg = h.seg("deep")
    h.tier.request_start("deep", 11.0)
    h.tier.request_admitted("deep", 11.0)
    h.tier.hint("deep", SessionHint(expected_gap_s=5.0), 11.0)
    h.result = h.tier.store([Run(seg, 20, 30)], "deep", 11.5)  # type: ignore[attr-defined]
    return h


def test_a_queued_session_gives_way_to_a_denser_store() -> None:
    """Scored as the incoming store is (age 0, its expected gap, its depth), the queued
    session's copy is worth less than the deep session's next ten blocks, so it goes."""
    h = _queued_case()
    assert h.result.admitted  # type: ignore[attr-defined]
    assert h.resident("queued") == 0 and h.resident("deep") == 30
    # Once admitted, the same session is protected again.
    g = Harness("tenure-density", 30, {"depth_scale_blocks": 10.0})
    g.turn("queued", 10, 0.0, gap=3600.0)
    g.turn("deep", 20, 0.0, gap=5.0)
    g.tier.request_start("queued", 10.0)
    g.tier.request_admitted("queued", 10.2)
    g.tier.request_start("deep", 11.0)
    g.tier.request_admitted("deep", 11.0)
    assert not g.tier.store([Run(g.seg("deep"), 20, 30)], "deep", 11.5).admitted
    assert g.resident("queued") == 10


def test_evict_waiting_off_protects_every_request_in_flight() -> None:
    h = _queued_case({"evict_waiting": 0.0})
    assert not h.result.admitted  # type: ignore[attr-defined]
    assert h.resident("queued") == 10 and h.resident("deep") == 20


def test_many_idle_residents_are_sampled_and_decisions_stay_deterministic() -> None:
    def run() -> list[int]:
        h = Harness("tenure-density", 200, {"sample": 16.0})
        for i in range(100):
            h.turn(f"s{i}", 2, float(i), gap=10.0 + i)
        out = []
        for k in range(20):
            result = h.turn(f"n{k}", 4, 200.0 + k, gap=1.0)
            out.append(len(result.victims) if result.admitted else -1)
        return out

    first = run()
    assert first == run()
    assert all(v > 0 for v in first)


def test_cold_spread_trusts_the_prediction_within_a_factor_of_two() -> None:
    spread = GapSpread(min_samples=8)
    left = spread.residual(GapSpread.bucket(10.0), 10.0, 0.0)
    assert left.survivors == 3 and left.mean_left == pytest.approx(35.0 / 3)
    assert spread.residual(GapSpread.bucket(10.0), 10.0, 25.0).survivors == 0


def test_the_written_out_yield_mean_equals_the_plain_one_float_for_float() -> None:
    """``HitYield.mean_along`` (the decision's inner loop, written out) against the mean of
    ``of`` over the same points: equal exactly, so the decisions do not move."""
    rng = random.Random(3)
    yields = HitYield(min_samples=3)
    for _ in range(2000):
        yields.observe(rng.choice([0.0, 0.1, 0.125, 1.0, 7.5, 300.0, 10**rng.uniform(0, 6)]),
                       rng.random())  # fmt: skip
    for _ in range(2000):
        distance = rng.choice([0, rng.randrange(100_000)])
        rate = rng.choice([0.0, rng.uniform(0.0, 500.0)])
        age = rng.uniform(0.0, 600.0)
        gaps = sorted(age + rng.expovariate(1 / 120.0) for _ in range(rng.randint(1, 16)))
        plain = sum(yields.of(distance + rate * (g - age)) for g in gaps) / len(gaps)
        assert yields.mean_along(distance, rate, age, gaps) == plain
    assert len({yields.of(10.0**k) for k in range(6)}) > 1  # the bins differ: not all prior


def test_the_lazy_ranking_equals_the_eager_sort_float_for_float() -> None:
    """``_ascending`` computes a candidate's yield mean only when its lower bound reaches the
    top; the order and every value it yields are the eager sort's, up to the stop."""
    rng = random.Random(11)
    h = Harness("tenure-density", 100_000, {"depth_scale_blocks": 50.0})
    policy = _density(h)
    for _ in range(3000):
        policy.yields.observe(10 ** rng.uniform(-1, 5), rng.random() ** 2)
        gap = 10 ** rng.uniform(0, 4)  # real gaps around each prediction: warm spreads
        policy.spread.observe(GapSpread.bucket(gap * 10 ** rng.uniform(-0.5, 0.5)), gap)
    policy.clock = 50_000
    policy._ticks.extend([(-600.0, 20_000), (0.0, 50_000)])
    names = [f"s{i}" for i in range(60)]
    for name in names:
        h.turn(name, rng.randint(1, 400), rng.uniform(-500.0, 0.0), gap=10 ** rng.uniform(0, 4))
        policy._used_at[name] = rng.randint(0, 50_000)
    h.tier.request_start("s0", 1.0)  # one in flight (queued): scored as an incoming store
    h.turn("gone", 5, -10.0, last=True)  # a finished one: density 0
    checked, distinct = 0, 0
    for now in (5.0, 60.0, 900.0, 20_000.0):
        sessions = [*names, "gone"]
        eager = sorted((policy.session_density(s, now), s) for s in sessions)
        distinct = max(distinct, len({d for d, _s in eager}))
        lazy = list(policy._ascending(sessions, now, math.inf))
        assert lazy == eager
        for stop in (eager[5][0], eager[30][0], (eager[10][0] + eager[11][0]) / 2):
            cut = next(i for i, (d, _s) in enumerate(eager) if d >= stop)
            got = list(policy._ascending(sessions, now, stop))
            assert got[:cut] == eager[:cut]
            assert len(got) == cut + 1 and got[cut][0] >= stop
            checked += 1
    assert checked == 12
    assert distinct > 30  # the values differ: the order is not trivial


def test_the_yield_floor_is_the_least_value_any_distance_reads() -> None:
    yields = HitYield(min_samples=2, prior=0.9)
    assert yields.floor() == 0.9  # nothing learned: every distance reads the prior
    for share in (0.2, 0.4):
        yields.observe(10.0, share)
    yields.observe(1000.0, 0.05)  # one sample: still the prior there
    assert yields.floor() == pytest.approx(0.3)
    yields.observe(1000.0, 0.05)
    assert yields.floor() == pytest.approx(0.05)
    for share in (1.0,) * 40:  # the bin's mean rises: the floor follows
        yields.observe(1000.0, share)
    assert yields.floor() == pytest.approx(0.3)
    rng = random.Random(5)
    for _ in range(500):
        gaps = sorted(rng.uniform(0.0, 900.0) for _ in range(rng.randint(1, 16)))
        mean = yields.mean_along(rng.uniform(0, 5000), rng.uniform(0, 50), 0.0, gaps)
        assert mean >= yields.floor() * (1.0 - 1e-9)
