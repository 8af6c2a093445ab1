"""The SDK's requests and its handling of answers, sync and async, against a recording fake."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from tenure.clients import (
    AsyncTenureSession,
    RetryPolicy,
    TenureLifecycleError,
    TenureSession,
    TenureUsageError,
)

MESSAGES = [{"role": "user", "content": "list the files"}]
FAST_RETRY = RetryPolicy(attempts=3, base_delay_s=0.0, max_delay_s=0.0)


@pytest.fixture(params=["sync", "async"])
def make(request: Any, sync_clients: Any, async_clients: Any) -> Any:
    """Build a sync or async session over the fake; the same test body drives both."""

    def build(session_id: str | None = "task-1", **kwargs: Any) -> Any:
        if request.param == "sync":
            oa, http = sync_clients
            return TenureSession(oa, session_id, http_client=http, retry=FAST_RETRY, **kwargs)
        oa, http = async_clients
        return AsyncTenureSession(oa, session_id, http_client=http, retry=FAST_RETRY, **kwargs)

    return build


async def run(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def test_chat_carries_session_gap_and_segment(make: Any, fake_sidecar: Any) -> None:
    """Every completion carries the session id; gap in integer ms; segment and caller headers."""
    s = make(expected_gap_s=2.5, segment="lead")
    reply = await run(
        s.chat(
            model="m",
            messages=MESSAGES,
            extra_headers={"X-Trace": "t1", "x-tenure-session": "stale"},
        )
    )
    assert reply.choices[0].message.content == "ok"
    [seen] = fake_sidecar.of("/chat/completions")
    assert seen.headers["x-tenure-session"] == "task-1"
    assert seen.headers["x-tenure-expected-gap-ms"] == "2500"
    assert seen.headers["x-tenure-segment"] == "lead"
    assert seen.headers["x-trace"] == "t1"
    assert "x-tenure-last-turn" not in seen.headers
    assert "x-tenure-parent" not in seen.headers
    assert seen.body["messages"] == MESSAGES
    assert "tenure" not in seen.body
    assert s.turns == 1 and s.state == "open"


async def test_per_call_gap_overrides_default(make: Any, fake_sidecar: Any) -> None:
    s = make(expected_gap_s=2.5)
    await run(s.chat(model="m", messages=MESSAGES, expected_gap_s=0.04, segment="reasoning"))
    [seen] = fake_sidecar.of("/chat/completions")
    assert seen.headers["x-tenure-expected-gap-ms"] == "40"
    assert seen.headers["x-tenure-segment"] == "reasoning"


async def test_last_turn_marks_and_skips_end_on_exit(make: Any, fake_sidecar: Any) -> None:
    """A declared last turn finishes the session: no gap hint, no extra end call on exit."""
    s = make(expected_gap_s=5)
    await run(s.__aenter__() if hasattr(s, "__aenter__") else s.__enter__())
    await run(s.chat(model="m", messages=MESSAGES, last_turn=True))
    await run(
        s.__aexit__(None, None, None) if hasattr(s, "__aexit__") else s.__exit__(None, None, None)
    )
    [seen] = fake_sidecar.of("/chat/completions")
    assert seen.headers["x-tenure-last-turn"] == "true"
    assert "x-tenure-expected-gap-ms" not in seen.headers
    assert fake_sidecar.of("/end") == []
    assert s.state == "finished"
    with pytest.raises(TenureUsageError, match="finished"):
        await run(s.chat(model="m", messages=MESSAGES))
    assert len(fake_sidecar.seen) == 1


async def test_streaming_passes_chunks_and_hints(make: Any, fake_sidecar: Any) -> None:
    s = make()
    stream = await run(s.chat(model="m", messages=MESSAGES, stream=True))
    if hasattr(stream, "__aiter__"):
        texts = [c.choices[0].delta.content async for c in stream]
    else:
        texts = [c.choices[0].delta.content for c in stream]
    assert texts == ["he", "llo"]
    [seen] = fake_sidecar.of("/chat/completions")
    assert seen.body["stream"] is True
    assert seen.headers["x-tenure-session"] == "task-1"


async def test_text_completions_carry_hints(make: Any, fake_sidecar: Any) -> None:
    s = make()
    reply = await run(s.complete(model="m", prompt="def f(", expected_gap_s=1))
    assert reply.choices[0].text == "ok"
    [seen] = [x for x in fake_sidecar.seen if x.path == "/v1/completions"]
    assert seen.headers["x-tenure-session"] == "task-1"
    assert seen.headers["x-tenure-expected-gap-ms"] == "1000"


async def test_suspend_resume_end_requests(make: Any, fake_sidecar: Any) -> None:
    """Lifecycle calls hit /v1/sessions/{id}/..., with the tenant's bearer key and JSON bodies."""
    s = make()
    await run(s.suspend(reason="approval", expected_wait_s=600))
    assert s.state == "suspended"
    await run(s.resume())
    assert s.state == "open"
    await run(s.end())
    assert s.state == "finished"
    calls = [(x.method, x.path, x.body) for x in fake_sidecar.seen]
    assert calls == [
        ("POST", "/v1/sessions/task-1/suspend", {"reason": "approval", "expected_wait_s": 600.0}),
        ("POST", "/v1/sessions/task-1/resume", {}),
        ("POST", "/v1/sessions/task-1/end", {}),
    ]
    assert all(
        x.headers["authorization"] == f"Bearer {fake_sidecar.api_key}" for x in fake_sidecar.seen
    )


async def test_spawn_creates_child_with_parent(make: Any, fake_sidecar: Any) -> None:
    """A spawned worker is registered on the parent, and its calls name the parent."""
    s = make(segment="lead")
    child = await run(s.spawn("task-1.w1", role="reviewer", metadata={"tools": ["grep"]}))
    [spawn] = fake_sidecar.of("/workers")
    assert spawn.path == "/v1/sessions/task-1/workers"
    assert spawn.body == {
        "worker_id": "task-1.w1",
        "role": "reviewer",
        "metadata": {"tools": ["grep"]},
    }
    assert child.session_id == "task-1.w1" and child.parent == "task-1"
    await run(child.chat(model="m", messages=MESSAGES, last_turn=True))
    [seen] = fake_sidecar.of("/chat/completions")
    assert seen.headers["x-tenure-session"] == "task-1.w1"
    assert seen.headers["x-tenure-parent"] == "task-1"
    assert seen.headers["x-tenure-last-turn"] == "true"
    assert s.state == "open"


async def test_generated_ids_are_valid(make: Any, fake_sidecar: Any) -> None:
    s = make(session_id=None)
    child = await run(s.spawn())
    assert s.session_id.startswith("s-") and child.session_id.startswith("s-")
    assert child.session_id != s.session_id


async def test_retries_503_with_retry_after_then_succeeds(make: Any, fake_sidecar: Any) -> None:
    """Redis down on the sidecar (503 + Retry-After) is ridden out by a bounded retry."""
    fake_sidecar.lifecycle_failures = [(503, {"retry-after": "0"}), (503, {"retry-after": "0"})]
    s = make()
    await run(s.suspend())
    assert len(fake_sidecar.of("/suspend")) == 3
    assert s.state == "suspended"


async def test_gives_up_after_bounded_retries(make: Any, fake_sidecar: Any) -> None:
    fake_sidecar.lifecycle_failures = [(503, {"retry-after": "0"})] * 5
    s = make()
    with pytest.raises(TenureLifecycleError) as err:
        await run(s.end())
    assert err.value.status == 503 and err.value.action == "end"
    assert "redis unavailable" in str(err.value)
    assert len(fake_sidecar.of("/end")) == 3
    assert s.state == "open"


async def test_client_errors_are_not_retried(make: Any, fake_sidecar: Any) -> None:
    fake_sidecar.lifecycle_failures = [(404, {})]
    s = make()
    with pytest.raises(TenureLifecycleError) as err:
        await run(s.resume())
    assert err.value.status == 404
    assert len(fake_sidecar.seen) == 1


async def test_connection_refused_is_retried_then_reported(make: Any, fake_sidecar: Any) -> None:
    fake_sidecar.refuse_connections = 1
    s = make()
    await run(s.end())
    assert len(fake_sidecar.of("/end")) == 1 and s.state == "finished"
    fake_sidecar.refuse_connections = 3
    s2 = make("task-2")
    with pytest.raises(TenureLifecycleError) as err:
        await run(s2.end())
    assert err.value.status is None and "ConnectError" in err.value.detail


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"session_id": "has space"}, "session_id"),
        ({"session_id": "x" * 200}, "session_id"),
        ({"parent": "../etc"}, "parent"),
        ({"expected_gap_s": -1}, "expected_gap_s"),
        ({"expected_gap_s": float("nan")}, "expected_gap_s"),
        ({"expected_gap_s": 10**9}, "expected_gap_s"),
    ],
)
async def test_bad_arguments_name_the_field(
    make: Any, fake_sidecar: Any, kwargs: Any, field: Any
) -> None:
    with pytest.raises(TenureUsageError, match=field):
        make(**kwargs)
    assert fake_sidecar.seen == []


async def test_bad_call_arguments_send_nothing(make: Any, fake_sidecar: Any) -> None:
    s = make()
    with pytest.raises(TenureUsageError, match="expected_gap_s"):
        await run(s.chat(model="m", messages=MESSAGES, expected_gap_s="soon"))
    with pytest.raises(TenureUsageError, match="expected_wait_s"):
        await run(s.suspend(expected_wait_s=-3))
    with pytest.raises(TenureUsageError, match="worker_id"):
        await run(s.spawn("no/slashes"))
    assert fake_sidecar.seen == []


def test_repr_hides_the_api_key(sync_clients: Any, fake_sidecar: Any) -> None:
    oa, http = sync_clients
    s = TenureSession(oa, "task-1", http_client=http)
    assert fake_sidecar.api_key not in repr(s) and "task-1" in repr(s)


def test_sync_context_exit_ends_also_on_exception(sync_clients: Any, fake_sidecar: Any) -> None:
    oa, http = sync_clients
    with TenureSession(oa, "task-1", http_client=http) as s:
        s.chat(model="m", messages=MESSAGES)
    assert [x.path for x in fake_sidecar.seen][-1] == "/v1/sessions/task-1/end"
    with (
        pytest.raises(RuntimeError, match="tool crashed"),
        TenureSession(oa, "task-2", http_client=http),
    ):
        raise RuntimeError("tool crashed")
    assert fake_sidecar.seen[-1].path == "/v1/sessions/task-2/end"


def test_sync_exit_keeps_the_body_exception_when_end_fails(
    sync_clients: Any, fake_sidecar: Any
) -> None:
    """An unreachable sidecar at exit must not hide why the agent loop failed."""
    oa, http = sync_clients
    fake_sidecar.lifecycle_failures = [(503, {"retry-after": "0"})] * 3
    with (
        pytest.raises(KeyError, match="the real problem"),
        TenureSession(oa, "task-3", http_client=http, retry=FAST_RETRY),
    ):
        raise KeyError("the real problem")
    assert len(fake_sidecar.of("/end")) == 3
    # Without a body exception, the failed end is reported.
    fake_sidecar.lifecycle_failures = [(500, {})]
    with pytest.raises(TenureLifecycleError), TenureSession(oa, "task-4", http_client=http):
        pass


async def test_async_context_exit_ends_also_on_exception(
    async_clients: Any, fake_sidecar: Any
) -> None:
    oa, http = async_clients
    async with AsyncTenureSession(oa, "task-1", http_client=http) as s:
        worker = await s.spawn("task-1.w1")
        async with worker:
            await worker.chat(model="m", messages=MESSAGES)
        assert fake_sidecar.seen[-1].path == "/v1/sessions/task-1.w1/end"
    assert fake_sidecar.seen[-1].path == "/v1/sessions/task-1/end"
    with pytest.raises(asyncio.CancelledError):
        async with AsyncTenureSession(oa, "task-2", http_client=http):
            raise asyncio.CancelledError
    assert fake_sidecar.seen[-1].path == "/v1/sessions/task-2/end"


def test_exit_without_a_session_on_the_sidecar_is_quiet(
    sync_clients: Any, fake_sidecar: Any
) -> None:
    """A block that made no call has no session on the sidecar (404): nothing to end."""
    oa, http = sync_clients
    fake_sidecar.lifecycle_failures = [(404, {})]
    with TenureSession(oa, "never-used", http_client=http):
        pass
    assert fake_sidecar.of("/end")[0].path == "/v1/sessions/never-used/end"
    # An explicit end still reports it.
    fake_sidecar.lifecycle_failures = [(404, {})]
    with pytest.raises(TenureLifecycleError):
        TenureSession(oa, "never-used", http_client=http).end()


async def test_stale_tenure_headers_from_the_caller_are_dropped(
    make: Any, fake_sidecar: Any
) -> None:
    s = make()
    await run(
        s.chat(
            model="m", messages=MESSAGES, extra_headers={"X-Tenure-Last-Turn": "true", "X-A": "1"}
        )
    )
    [seen] = fake_sidecar.of("/chat/completions")
    assert "x-tenure-last-turn" not in seen.headers and seen.headers["x-a"] == "1"
    assert s.state == "open"


def test_hint_headers_for_clients_the_sdk_does_not_own(
    sync_clients: Any, fake_sidecar: Any
) -> None:
    """A framework that owns the OpenAI client can still carry the session's hints."""
    oa, http = sync_clients
    s = TenureSession(oa, "task-h", http_client=http, segment="lead", parent="task-p")
    assert s.hint_headers(expected_gap_s=0.25) == {
        "X-Tenure-Session": "task-h",
        "X-Tenure-Expected-Gap-Ms": "250",
        "X-Tenure-Segment": "lead",
        "X-Tenure-Parent": "task-p",
    }
    oa.with_options(default_headers=s.hint_headers(last_turn=True)).chat.completions.create(
        model="m", messages=MESSAGES
    )
    [seen] = fake_sidecar.of("/chat/completions")
    assert seen.headers["x-tenure-session"] == "task-h"
    assert seen.headers["x-tenure-last-turn"] == "true"
