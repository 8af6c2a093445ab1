"""The adapter's resume classification on vLLM's own ``ReqContext`` (no engine needed).

The scheduler records every full block's end position, looks the host tier up only past the
blocks the GPU prefix cache holds, and loads the hits; the adapter records where the lookups
started and how many blocks were loaded (on the request's state), and the tracker turns that
into an outcome.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import ReqContext

from tenure.engine_adapter.resumes import ResumeTracker

BLOCK = 128


def _request(tracker: ResumeTracker, session: str, blocks: int) -> ReqContext:
    ctx = ReqContext(req_id=f"r-{session}")
    for i in range(blocks):
        ctx.set_offload_key_position(bytes([i]), (i + 1) * BLOCK)  # type: ignore[arg-type]
    tracker.start(session, ctx)
    return ctx


def _lookup_from(first: int) -> int:
    """The end token of the first block looked up: the GPU held blocks ``0 .. first - 1``."""
    return (first + 1) * BLOCK


def test_each_source_is_classified_and_counted_in_tokens() -> None:
    clock = iter([100.0, 100.0, 100.0]).__next__
    tracker = ResumeTracker(wall_clock=clock)
    tracker.suspended("t/host", issued_at=40.0, ttl_s=None)
    tracker.suspended("t/gone", issued_at=40.0, ttl_s=5.0)
    tracker.suspended("t/hbm", issued_at=90.0, ttl_s=None)

    ctx = _request(tracker, "t/host", 4)  # GPU held nothing, three blocks came from host
    tracker.finish(ctx, _lookup_from(0), 3)

    ctx = _request(tracker, "t/gone", 4)  # timer expired: every lookup missed, nothing loaded
    tracker.finish(ctx, _lookup_from(0), 0)

    ctx = _request(tracker, "t/hbm", 4)  # the GPU held all full blocks: no lookup at all
    tracker.finish(ctx, None, 0)

    host, gone, hbm = tracker.drain()
    assert (host.outcome, host.branch, host.tenant) == ("host", "retain", "t")
    assert (host.hbm_tokens, host.host_tokens, host.computed_tokens) == (0, 384, 128)
    assert host.wait_s == 60.0 and host.host_held_s == 60.0
    assert (gone.outcome, gone.branch) == ("recomputed", "ttl")
    assert gone.computed_tokens == 512 and gone.host_held_s == 5.0  # held only until the timer
    assert (hbm.outcome, hbm.hbm_tokens, hbm.prompt_tokens) == ("hbm", 512, 512)
    assert tracker.drain() == []


def test_only_the_first_request_after_a_suspension_is_a_resume() -> None:
    tracker = ResumeTracker(wall_clock=lambda: 10.0)
    ctx = _request(tracker, "t/never-suspended", 2)
    tracker.finish(ctx, None, 0)
    tracker.suspended("t/s", issued_at=1.0, ttl_s=None)
    ctx = _request(tracker, "t/s", 2)
    tracker.finish(ctx, _lookup_from(1), 0)  # the GPU held block 0
    tracker.finish(ctx, _lookup_from(1), 0)  # finished twice: counted once
    again = _request(tracker, "t/s", 2)
    tracker.finish(again, None, 0)
    (only,) = tracker.drain()
    assert (only.outcome, only.hbm_tokens, only.computed_tokens) == ("hbm", 128, 128)
    tracker.suspended("t/ended", issued_at=1.0, ttl_s=None)
    tracker.forget("t/ended")
    tracker.finish(_request(tracker, "t/ended", 2), None, 0)
    assert tracker.drain() == [] and len(tracker) == 0
