"""The adapter's segment book without an engine: admission, references, deletion, bad tags."""

from __future__ import annotations

from typing import Any

from tenure.engine_adapter.segment_book import UNTAGGED, SegmentBook
from tenure.service.policy.placement import create_placement

B = 128  # tokens per block


def book(budget: int = 6) -> SegmentBook:
    return SegmentBook(create_placement("lachesis-wt"), budget, B)


def params(session: str | None = None, **tenure: Any) -> dict[str, Any]:
    if session is None:
        return {}
    return {"tenure": {"session_id": session, **tenure}}


def block(i: int) -> tuple[int, int]:
    return i * B, (i + 1) * B


LEAD = [{"id": "ctx", "class": "lead", "start": 0}]


def test_untagged_requests_behave_like_vllm():
    b = book()
    assert b.begin("r1", params()) == []
    assert b.classify("r1", *block(0)) == (UNTAGGED, None)
    assert b.admit("r1", "k0", *block(0))
    assert not b.owns("k0")
    assert b.finish("r1") == []


def test_reasoning_is_refused_and_lead_files_are_deleted_at_the_last_turn():
    b = book()
    segs = [*LEAD, {"id": "r0", "class": "reasoning", "start": 2 * B}]
    b.begin("r1", params("L", turn=1, segments=segs))
    assert b.admit("r1", "lead0", *block(0)) and b.admit("r1", "lead1", *block(1))
    assert not b.admit("r1", "reason", *block(2))
    # A block that straddles the boundary holds reasoning: refused too.
    assert not b.admit("r1", "mixed", 2 * B - 10, 3 * B - 10)
    for key in ("lead0", "lead1"):
        b.written(key)
    assert b.finish("r1") == []
    assert b.table.resident_blocks("ssd") == 2
    # The next turn does not carry the reasoning: its segment closes (nothing was on disk).
    assert b.begin("r2", params("L", turn=2, segments=LEAD)) == []
    assert b.table.get("L", "r0") is None
    b.finish("r2")
    b.begin("r3", params("L", turn=3, segments=LEAD, last_turn=True))
    deleted = b.finish("r3")
    assert sorted(map(str, deleted)) == ["lead0", "lead1"]
    assert [b.deleted(k, True) for k in deleted] == ["lead", "lead"]
    assert b.table.resident_blocks() == 0 and b.table.leaked() == []


def test_a_file_shared_by_two_sessions_is_deleted_when_the_last_one_ends():
    b = book()
    b.begin("a1", params("A", turn=0, segments=LEAD))
    assert b.admit("a1", "sys", *block(0))
    b.written("sys")
    b.begin("b1", params("B", turn=0, segments=LEAD))
    b.touch("b1", "sys", *block(0))  # B hit the same prefix block
    b.finish("a1")
    b.finish("b1")
    b.begin("a2", params("A", turn=1, segments=LEAD, last_turn=True))
    assert b.finish("a2") == []  # B still uses it
    b.begin("b2", params("B", turn=1, segments=LEAD, last_turn=True))
    assert b.finish("b2") == ["sys"]


def test_predictive_path_keeps_the_shortest_worker_off_the_ssd():
    b = book(budget=6)
    b.begin("l0", params("L", turn=0, segments=LEAD))

    def spawn(req: str, name: str, life: float) -> None:
        b.begin(
            req,
            params(
                f"L/{name}",
                turn=0,
                role="worker",
                parent_session="L",
                predicted_lifetime_s=life,
                expected_tokens=4 * B,
                segments=[{"id": "ctx", "class": "worker", "start": 0}],
            ),
        )

    spawn("w1", "long", 400.0)
    spawn("w2", "short", 20.0)  # re-ranking: the short one takes the fast budget
    assert not b.admit("w2", "s0", *block(0))
    assert b.admit("w1", "l0", *block(0))
    b.written("l0")
    b.finish("w1")
    b.begin("w1b", params("L/long", turn=1, role="worker", parent_session="L", last_turn=True))
    assert b.finish("w1b") == ["l0"]


def test_explicit_close_deletes_a_segments_files():
    b = book()
    segs = [*LEAD, {"id": "tail", "class": "output", "start": B}]
    b.begin("r1", params("L", turn=0, segments=segs))
    assert b.admit("r1", "t", *block(1))
    b.written("t")
    b.finish("r1")
    assert b.begin("r2", params("L", turn=1, segments=LEAD, close=["tail"])) == ["t"]


def test_bad_tags_are_counted_and_served_untagged():
    b = book()
    b.begin("x", params("W", role="worker", parent_session="nobody"))
    assert b.errors["boundary"] == 1 and b.classify("x", *block(0))[0] == UNTAGGED
    b.begin("y", params("L", turn=1, segments=[{"id": "a", "class": "lead", "start": 3}]))
    assert b.errors["segments"] == 1
    b.begin("z", params("L", turn=0))
    assert b.errors["boundary"] == 2  # turn went backwards
    b.begin("q", params("L", turn="two"))  # dropped (counted), so it reads as turn 0: backwards
    assert b.errors["tags"] == 1 and b.errors["boundary"] == 3
    b.begin("c", params("L", turn=2, close=["never-opened"]))
    assert b.errors["boundary"] == 4
