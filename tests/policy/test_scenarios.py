"""Scenario tests: one behaviour each, on a tiny tier with integer-sized sessions."""

from __future__ import annotations

import math

import pytest

from tenure.service.policy import EvictionClass, Run, SessionHint
from tenure.service.policy.sessions import SessionPolicy
from tests.policy.harness import Harness


def test_gate_evicts_finished_before_overdue_before_far_wakeup() -> None:
    """Class order: finished (declared last turn, reclaim off) > overdue > far-wakeup."""
    h = Harness("tenure", 30, {"overdue_slack_s": 1.0, "overdue_slack_frac": 0.0})
    h.turn("far", 10, 0.0, gap=1000.0)
    h.turn("overdue", 10, 1.0, gap=2.0)
    h.turn("near", 10, 2.0, gap=50.0)
    # At t=10 "overdue" woke at 4 (+1 slack) and is late; "far" wakes at 1001.
    result = h.turn("new", 10, 10.0, gap=5.0)
    assert result.admitted
    assert {v.cls for v in result.victims} == {EvictionClass.OVERDUE}
    assert h.resident("overdue") == 0 and h.resident("far") == 10
    result = h.turn("new2", 10, 11.0, gap=5.0)
    assert {v.cls for v in result.victims} == {EvictionClass.FAR_WAKEUP}
    assert h.resident("far") == 0 and h.resident("near") == 10


def test_gate_takes_most_overdue_first() -> None:
    h = Harness("tenure", 20, {"overdue_slack_s": 0.0, "overdue_slack_frac": 0.0})
    h.turn("late", 10, 0.0, gap=1.0)
    h.turn("later", 10, 0.0, gap=0.5)
    result = h.turn("new", 5, 100.0, gap=5.0)
    assert [v.cls for v in result.victims] == [EvictionClass.OVERDUE]
    assert h.resident("later") == 5 and h.resident("late") == 10  # tail-first, partial


def test_gate_takes_largest_remaining_gap_first() -> None:
    h = Harness("tenure", 20)
    h.turn("a", 10, 0.0, gap=600.0)
    h.turn("b", 10, 0.0, gap=900.0)
    h.turn("new", 10, 5.0, gap=10.0)
    assert h.resident("b") == 0 and h.resident("a") == 10


def test_gate_refuses_a_newcomer_that_wakes_last() -> None:
    """Refuse worst: residents that wake sooner are not displaced; nothing changes."""
    h = Harness("tenure", 20)
    h.turn("a", 10, 0.0, gap=10.0)
    h.turn("b", 10, 0.0, gap=20.0)
    result = h.turn("slow", 10, 5.0, gap=3600.0)
    assert not result.admitted
    assert h.resident("a") == 10 and h.resident("b") == 10
    assert h.tier.counters["refusals"] == 1 and h.tier.counters["refused_blocks"] == 10


def test_gate_never_evicts_by_plain_recency() -> None:
    h = Harness("tenure", 50)
    for i in range(200):
        h.turn(f"s{i % 13}", 3, float(i), gap=[5.0, 60.0, 600.0][i % 3], last=i % 17 == 0)
    counters = h.tier.policy.counters
    assert counters["evicted_blocks_recency"] == 0
    assert sum(v for k, v in counters.items() if k.startswith("evicted_blocks_")) > 0


def test_declared_last_turn_reclaims_at_once_and_not_before() -> None:
    h = Harness("tenure", 100)
    h.turn("s", 10, 0.0, gap=5.0)
    seg = h.seg("s")
    h.tier.request_start("s", 10.0)
    h.tier.hint("s", SessionHint(expected_gap_s=None, last_turn=True), 10.0)
    assert h.resident("s") == 10  # the last turn still reads its context
    h.tier.store([Run(seg, 10, 12)], "s", 10.0)
    reclaimed = h.tier.access([Run(seg, 0, 12)], 11.0)
    assert h.resident("s") == 0
    assert {v.cls for v in reclaimed} == {EvictionClass.RECLAIM}
    assert sum(v.run.blocks for v in reclaimed) == 12


def test_last_turn_store_is_refused_rather_than_evicting_anyone() -> None:
    """A declared last turn's blocks are never read again: they displace nobody."""
    h = Harness("tenure", 10)
    h.turn("a", 10, 0.0, gap=1000.0)
    result = h.turn("done", 5, 1.0, last=True)
    assert not result.admitted and h.resident("a") == 10


def test_tags_off_keeps_live_residents_and_ages_out_idle_ones() -> None:
    """No hints: classes collapse to idle order; live residents are never displaced."""
    params = {"idle_fallback_s": 60.0, "overdue_slack_s": 0.0, "overdue_slack_frac": 0.0}
    h = Harness("tenure-tags-off", 20, params)
    h.turn("a", 10, 0.0)
    h.turn("b", 10, 30.0)
    assert not h.turn("c", 10, 40.0).admitted  # a and b are within the idle horizon
    result = h.turn("d", 10, 75.0)  # a idle 74 s > 60 s horizon: overdue; b is not
    assert result.admitted and h.resident("a") == 0 and h.resident("b") == 10
    assert {v.cls for v in result.victims} == {EvictionClass.OVERDUE}


def test_tags_off_ignores_hints() -> None:
    h = Harness("tenure-tags-off", 10, {"idle_fallback_s": 60.0})
    h.turn("a", 10, 0.0, gap=1.0, last=True)
    assert h.resident("a") == 10  # no reclaim: it never saw the last-turn hint


def test_literal_gate_never_evicts_a_live_resident() -> None:
    h = Harness("gate-only-literal", 20)
    h.turn("a", 10, 0.0, gap=3600.0)
    h.turn("b", 10, 0.0, gap=3600.0)
    assert not h.turn("c", 5, 5000.0, gap=1.0).admitted
    assert h.resident("a") == 10 and h.resident("b") == 10


def test_suspended_host_copy_discarded_when_ttl_expires_not_before() -> None:
    h = Harness("tenure", 100)
    h.turn("s", 10, 0.0, gap=5.0)
    h.tier.hint("s", SessionHint(expected_gap_s=1800.0, suspended=True, host_ttl_s=60.0), 2.0)
    assert h.tier.policy.next_timer() == pytest.approx(62.0)
    assert h.tier.expire(61.9) == [] and h.resident("s") == 10
    expired = h.tier.expire(62.0)
    assert h.resident("s") == 0 and {v.cls for v in expired} == {EvictionClass.TTL}
    assert h.tier.policy.counters["ttl_expiries"] == 1


def test_resume_before_ttl_cancels_the_discard() -> None:
    h = Harness("tenure", 100)
    h.turn("s", 10, 0.0, gap=5.0)
    h.tier.hint("s", SessionHint(suspended=True, host_ttl_s=60.0), 2.0)
    h.turn("s", 2, 30.0, gap=5.0)  # resumed: a new request
    assert h.tier.expire(100.0) == [] and h.resident("s") == 12


def test_lru_reclaim_frees_on_last_turn_and_lru_does_not() -> None:
    for name, expected in (("lru-reclaim", 0), ("lru", 8)):
        h = Harness(name, 100)
        h.turn("s", 8, 0.0, last=True)
        assert h.resident("s") == expected, name


def test_notier_stores_nothing_and_infinite_refuses_nothing() -> None:
    none, inf = Harness("notier", 100), Harness("infinite", 1)
    for i in range(20):
        assert not none.turn(f"s{i}", 5, float(i)).admitted
        assert inf.turn(f"s{i}", 5, float(i)).admitted
    assert none.tier.used == 0 and inf.tier.used == 100


def test_oracle_evicts_farthest_next_use_and_refuses_when_incoming_is_farthest() -> None:
    h = Harness("oracle", 20)
    h.turn("soon", 10, 0.0, gap=10.0)
    h.turn("late", 10, 0.0, gap=500.0)
    assert h.turn("mid", 10, 2.0, gap=100.0).admitted
    assert h.resident("late") == 0 and h.resident("soon") == 10
    assert not h.turn("never", 10, 3.0, gap=math.inf).admitted


def test_mori_evicts_the_longest_idle_session() -> None:
    h = Harness("mori", 20)
    h.turn("old", 10, 0.0)
    h.turn("recent", 10, 50.0)
    h.turn("new", 10, 60.0)
    assert h.resident("old") == 0 and h.resident("recent") == 10


def test_marconi_at_alpha_zero_keeps_the_longest_prefix() -> None:
    """Pure FLOP efficiency: a long prefix saves more compute per byte than a short one."""
    h = Harness("marconi", 40, {"alpha": 0.0})
    h.turn("long", 30, 10.0)
    h.turn("short", 5, 0.0)
    h.turn("new", 10, 20.0)
    assert h.resident("short") == 0 and h.resident("long") == 30


def test_ttl_pins_until_expiry_then_force_evicts_earliest_pin() -> None:
    h = Harness("ttl", 20)
    h.turn("pinned", 10, 0.0, gap=100.0)
    h.turn("expired", 10, 0.0, gap=1.0)
    h.turn("new", 10, 10.0, gap=1.0)
    assert h.resident("expired") == 0 and h.resident("pinned") == 10
    result = h.turn("new2", 10, 20.0, gap=1.0)  # only pins left: TTL force-evicts, never refuses
    assert result.admitted and {v.cls for v in result.victims} <= {
        EvictionClass.TTL,
        EvictionClass.RECENCY,
    }


def _lives(h: Harness) -> SessionPolicy:
    policy = h.tier.policy
    assert isinstance(policy, SessionPolicy)
    return policy


def test_a_likely_end_goes_first_but_is_not_reclaimed() -> None:
    """Issue 24: an inferred end (a one-shot run's final answer) is evicted before any live
    session, overdue ones included, yet keeps its blocks until room is needed, and a run
    resumed later (``--continue``) hits what is still resident."""
    h = Harness("tenure", 20, {"overdue_slack_s": 1.0, "overdue_slack_frac": 0.0})
    h.turn("overdue", 10, 0.0, gap=1.0)
    h.turn("ended", 10, 1.0, gap=300.0)
    assert h.tier.hint("ended", SessionHint(likely_end=True), 2.0) == []
    assert h.resident("ended") == 10  # no reclaim: the end is only inferred
    # A newcomer needs 5 blocks at t=10: "overdue" is late, yet "ended" goes first.
    result = h.turn("new", 5, 10.0, gap=5.0)
    assert {v.cls for v in result.victims} == {EvictionClass.FINISHED}
    assert h.resident("ended") == 5 and h.resident("overdue") == 10
    # The run comes back: its head is still resident and is hit.
    seg = h.seg("ended")
    h.tier.request_start("ended", 20.0)
    assert h.tier.lookup([Run(seg, 0, 10)]) == 5
    h.tier.hint("ended", SessionHint(expected_gap_s=60.0), 20.0)
    assert not _lives(h).peek("ended").finished  # live again


def test_a_likely_end_hint_while_active_applies_when_the_turn_ends() -> None:
    h = Harness("tenure", 20)
    h.turn("s", 10, 0.0, gap=5.0)
    h.tier.request_start("s", 10.0)
    h.tier.hint("s", SessionHint(likely_end=True), 10.0)
    assert not _lives(h).peek("s").finished  # its turn still reads its context
    h.tier.access([Run(h.seg("s"), 0, 10)], 11.0)
    assert _lives(h).peek("s").finished and h.resident("s") == 10
