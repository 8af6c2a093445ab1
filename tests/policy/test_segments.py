"""The live-segment table: classes, boundaries, bad input and the no-leak invariant."""

from __future__ import annotations

import pytest

from tenure.service.policy.segments import (
    BoundaryOrderError,
    DuplicateSegmentError,
    SegmentClass,
    SegmentError,
    SegmentTable,
    SessionRole,
    UnknownParentError,
    UnknownSegmentError,
    WorkerReturnedError,
)


def lead_with_reasoning(table: SegmentTable) -> None:
    table.open_lead("L")
    table.next_turn("L", 0)
    table.open("L", "ctx", SegmentClass.LEAD)
    table.open("L", "r0", SegmentClass.REASONING)


def test_reasoning_closes_at_the_next_turn_and_carried_reasoning_stays():
    """A new turn closes the reasoning it does not carry back; carried reasoning stays open."""
    table = SegmentTable()
    lead_with_reasoning(table)
    table.open("L", "r0b", SegmentClass.REASONING)
    closed = table.next_turn("L", 1, keep=["r0b"])
    assert [s.key for s in closed] == ["L#r0"]
    assert table.get("L", "r0b") is not None and table.get("L", "ctx") is not None
    assert [s.key for s in table.next_turn("L", 2)] == ["L#r0b"]


def test_same_turn_again_is_a_retry_and_closes_nothing():
    table = SegmentTable()
    lead_with_reasoning(table)
    assert table.next_turn("L", 0) == []
    assert table.get("L", "r0") is not None


def test_worker_return_closes_its_segments_and_lead_end_closes_everything():
    table = SegmentTable()
    lead_with_reasoning(table)
    ctx = table.spawn("L/w1", "L", predicted_lifetime_s=30.0)
    assert ctx.cls is SegmentClass.WORKER and ctx.predicted_lifetime_s == 30.0
    rev = table.spawn("L/r1", "L", SessionRole.REVIEWER)
    assert rev.cls is SegmentClass.REVIEWER
    assert [s.session for s in table.workers()] == ["L/w1"]
    assert [s.key for s in table.worker_return("L/w1")] == ["L/w1#context"]
    assert table.workers() == []
    closed = {s.key for s in table.end_session("L")}
    assert closed == {"L#ctx", "L#r0", "L/r1#context"}
    assert list(table.live()) == []
    assert table.end_session("L") == []  # idempotent


@pytest.mark.parametrize(
    ("action", "error"),
    [
        (lambda t: t.spawn("X/w", "X"), UnknownParentError),
        (lambda t: t.spawn("L/w1", "L"), DuplicateSegmentError),
        (lambda t: t.next_turn("L", 0), BoundaryOrderError),
        (lambda t: t.worker_return("L/nobody"), WorkerReturnedError),
        (lambda t: t.worker_return("L"), BoundaryOrderError),
        (lambda t: t.close("L", "nope"), UnknownSegmentError),
        (lambda t: t.open("L", "ctx", SegmentClass.LEAD), DuplicateSegmentError),
        (lambda t: t.spawn("L/lead2", "L", SessionRole.LEAD), SegmentError),
        (lambda t: t.spawn("L/w2", "L", predicted_lifetime_s=-1.0), SegmentError),
        (lambda t: t.open_lead("L/w1"), SegmentError),
    ],
)
def test_bad_boundaries_raise_and_change_nothing(action, error):
    table = SegmentTable()
    lead_with_reasoning(table)
    table.next_turn("L", 3)
    table.open("L", "r3", SegmentClass.REASONING)
    table.spawn("L/w1", "L")
    before = sorted(s.key for s in table.live())
    with pytest.raises(error):
        action(table)
    assert sorted(s.key for s in table.live()) == before


def test_a_worker_that_returns_twice_is_refused():
    table = SegmentTable()
    table.open_lead("L")
    table.spawn("L/w1", "L")
    table.worker_return("L/w1")
    with pytest.raises(WorkerReturnedError, match="returned twice"):
        table.worker_return("L/w1")


def test_a_worker_cannot_return_before_its_own_sub_agents():
    table = SegmentTable()
    table.open_lead("L")
    table.spawn("L/w1", "L")
    table.spawn("L/w1/x", "L/w1")
    with pytest.raises(BoundaryOrderError, match="sub-agents"):
        table.worker_return("L/w1")
    table.worker_return("L/w1/x")
    table.worker_return("L/w1")


def test_spawn_under_an_ended_or_returned_parent_is_an_unknown_parent():
    table = SegmentTable()
    table.open_lead("L")
    table.spawn("L/w1", "L")
    table.worker_return("L/w1")
    with pytest.raises(UnknownParentError):
        table.spawn("L/w1/x", "L/w1")
    table.end_session("L")
    with pytest.raises(UnknownParentError):
        table.spawn("L/w9", "L")


def test_counted_blocks_return_to_zero_when_sessions_end():
    """Closed segments keep their blocks until the caller frees them; then nothing leaks."""
    table = SegmentTable()
    lead_with_reasoning(table)
    table.charge("L#ctx", "ssd", 5)
    table.charge("L#r0", "dram", 2)
    w = table.spawn("L/w1", "L")
    table.charge(w.key, "dram", 3)
    table.charge(w.key, "ssd", 1)
    assert table.resident_blocks() == 11
    assert table.resident_by_class("dram") == {SegmentClass.REASONING: 2, SegmentClass.WORKER: 3}
    closed = table.end_session("L")
    assert {s.key for s in closed} == {"L#ctx", "L#r0", "L/w1#context"}
    assert {s.key for s in table.leaked()} == {"L#ctx", "L#r0", "L/w1#context"}
    for seg in closed:
        for tier, n in list(seg.resident.items()):
            table.charge(seg.key, tier, -n)
    assert table.leaked() == [] and table.resident_blocks() == 0
    assert table.forget_ended() == 2
    assert table.live_sessions() == []


def test_charging_below_zero_or_an_unknown_segment_is_refused():
    table = SegmentTable()
    lead_with_reasoning(table)
    with pytest.raises(SegmentError):
        table.charge("L#ctx", "ssd", -1)
    with pytest.raises(UnknownSegmentError):
        table.charge("L#nope", "ssd", 1)
