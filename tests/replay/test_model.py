"""Segment resolution of block-id lists, and the GPU prefix-cache pool."""

from __future__ import annotations

from tenure.service.policy.types import Run
from tenure.service.replay.gpu_pool import GpuPrefixCache
from tenure.service.replay.model import SegmentBuilder, SegmentTable, Trace, rle, slice_runs


def _builder() -> tuple[Trace, SegmentBuilder]:
    trace = Trace("t", 16)
    return trace, SegmentBuilder(SegmentTable(trace.segment_owner))


def test_extension_appends_to_the_same_segment() -> None:
    _trace, b = _builder()
    assert b.resolve([(1, 4)], 0) == ((Run(0, 0, 4),), 0)
    assert b.resolve([(1, 4), (9, 2)], 0) == ((Run(0, 0, 6),), 4)


def test_rewritten_last_block_branches_and_keeps_the_orphan() -> None:
    trace, b = _builder()
    b.resolve([(1, 4)], 0)
    runs, seen = b.resolve([(1, 3), (20, 2)], 0)  # block id 4 replaced by 20, 21
    assert runs == (Run(0, 0, 3), Run(1, 0, 2)) and seen == 3
    assert trace.segment_owner == [0, 0]
    # The next call extends the branch, not the orphaned tail.
    assert b.resolve([(1, 3), (20, 3)], 0) == ((Run(0, 0, 3), Run(1, 0, 3)), 5)


def test_sessions_share_a_prefix_in_the_first_owners_segment() -> None:
    trace, b = _builder()
    b.resolve([(1, 5)], 0)
    runs, seen = b.resolve([(1, 2), (50, 3)], 1)
    assert runs == (Run(0, 0, 2), Run(1, 0, 3)) and seen == 2
    assert trace.segment_owner == [0, 1]


def test_helpers() -> None:
    assert rle([5, 6, 7, 9, 10]) == [(5, 3), (9, 2)]
    runs = [Run(0, 0, 4), Run(3, 0, 5)]
    assert slice_runs(runs, 2, 6) == [Run(0, 2, 4), Run(3, 0, 2)]
    assert slice_runs(runs, 4) == [Run(3, 0, 5)]


def test_gpu_pool_evicts_least_recently_freed_tail_first() -> None:
    pool = GpuPrefixCache(capacity_blocks=10, segments=3)
    a = [Run(0, 0, 4)]
    b = [Run(1, 0, 4)]
    assert pool.admit(a, 0) and pool.admit(b, 0)
    pool.release(a, 0)
    pool.release(b, 0)
    assert pool.hit(a) == 4 and pool.hit(b) == 4
    c = [Run(2, 0, 4)]
    assert pool.admit(c, 0)  # needs 2 more blocks: taken from a's tail (freed first)
    assert pool.hit(a) == 2 and pool.hit(b) == 4
    assert not pool.admit([Run(0, 0, 4)], 5)  # a(2 cached) + 2 + 5 > what b can free
    pool.release(c, 0)
    assert pool.admit([Run(0, 0, 4)], 2)


def test_gpu_pool_never_evicts_a_running_request() -> None:
    pool = GpuPrefixCache(capacity_blocks=6, segments=2)
    assert pool.admit([Run(0, 0, 4)], 1)
    assert not pool.admit([Run(1, 0, 2)], 1)  # only 1 block free, nothing evictable
    assert pool.held == 5
