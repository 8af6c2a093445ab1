"""Recorded Claude Code sessions with sub-agents, replayed through the live proxy: every fact a
spawn takes from its parent equals what the replay derives from the trace.

Each parent call goes through the sidecar (real sockets, real Redis) to a small upstream that
answers with the call's recorded usage (``in`` / ``out``) and, for a call that reasoned, a
``message.reasoning``; the new input of each request is what the call's ``input_types`` say
(user text, tool results). The sidecar's clock is stepped to the trace's times: a call arrives
at its ``t``, its answer ends when the next call's recorded ``think_time`` says it did (the
trace rounds ``t`` and ``think_time`` to the second, so ``t + api_time`` would be off by up to
a second); each sub-agent is spawned through the API at ``t - duration_ms`` and returns at its
``t`` (see :func:`tenure.service.replay.loaders.claude_code_meta._spawned_at`). A recording ranker
captures each :class:`~tenure.service.policy.ranker.SpawnRecord`, compared field by field with
:func:`~tenure.service.replay.loaders.claude_code_meta.load_claude_code_meta`'s.
"""

from __future__ import annotations

import gzip
import heapq
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

import tenure.service.app
from tenure.service.app import create_app
from tenure.service.policy.spawn_context import ParentCall, WorkerHistory, parent_features
from tenure.service.replay.loaders.claude_code_meta import TraceMeta, load_claude_code_meta
from tenure.service.replay.paths import claude_code_trace
from tenure.service.settings import Settings
from tests.sidecar.conftest import ADMIN_TOKEN
from tests.sidecar.fake_upstream import ServerThread
from tests.sidecar.test_segment_spawn_facts import Clock, RecordingRanker

#: Offset of the sidecar's clock (a session created at 0.0 would read as never created).
BASE = 100_000.0
#: Sessions with fan-outs, workers returned before later spawns, background agents (0295).
SESSIONS = ("trace_0277", "trace_0254", "trace_0010", "trace_0295")


class TraceUpstream:
    """Answers a chat completion with the usage the request's ``x_trace`` asks for."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        body = json.loads(raw) if raw else {}
        call = body.get("x_trace") or {"in": 1, "out": 1, "thinking": False, "end": None}
        if call["end"] is not None:
            self.clock.now = call["end"]  # the answer ends now
        message = {"role": "assistant", "content": "done"}
        if call["thinking"]:
            message["reasoning"] = "thought about it"
        answer = {
            "id": "cmpl-t",
            "object": "chat.completion",
            "model": body.get("model", "m"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": call["in"], "completion_tokens": call["out"]},
        }
        data = json.dumps(answer).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})


def _session(sid: str) -> dict[str, Any]:
    with gzip.open(claude_code_trace(), "rt", encoding="utf-8") as lines:
        for line in lines:
            if f'"{sid}"' in line[:64]:
                doc: dict[str, Any] = json.loads(line)
                if doc["id"] == sid:
                    return doc
    raise AssertionError(f"{sid} not in the trace")


def _new_input(types: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if "tool_result" in types:
        out.append({"role": "tool", "tool_call_id": "call_0", "content": "the tool's output"})
    if "text" in types:
        out.append({"role": "user", "content": "the human's message"})
    return out


@pytest.fixture
def replayed(redis_url: str, monkeypatch) -> Iterator[tuple[Any, ...]]:
    ranker = RecordingRanker()
    monkeypatch.setattr(tenure.service.app, "load_ranker", lambda _path: ranker)
    clock = Clock(BASE)
    up = ServerThread(TraceUpstream(clock)).start()
    settings = Settings(
        redis_url=SecretStr(redis_url), upstream_url=up.url, admin_token=SecretStr(ADMIN_TOKEN),
        push_addr="",
        refresh_interval_s=0.2, upstream_read_timeout_s=5.0, segments=True,
    )  # fmt: skip
    server = ServerThread(create_app(settings, clock=clock)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            yield http, ranker, clock
    finally:
        server.stop()
        up.stop()


def _replay_through_proxy(http: httpx.Client, clock: Clock, doc: dict[str, Any]) -> str:
    lead = "P" + doc["id"].removeprefix("trace_")
    requests = doc["requests"]
    calls = [r for r in requests if r.get("type") in ("n", "s")]
    returns: list[tuple[float, str]] = []  # (return time, worker)

    def returns_until(at: float) -> None:
        while returns and returns[0][0] <= at:
            back, worker = heapq.heappop(returns)
            clock.now = BASE + back
            assert http.post(f"/v1/sessions/{worker}/return").status_code == 200

    k, i, spawned = 0, 0, 0
    while i < len(requests):
        req = requests[i]
        if req.get("type") == "subagent":
            group = []
            while i < len(requests) and requests[i].get("type") == "subagent":
                entry = requests[i]
                if any(r.get("type") in ("n", "s") for r in entry["requests"]):
                    group.append(entry)
                i += 1
            spawns = []
            for entry in group:
                done = entry.get("duration_ms")
                life = done / 1000.0 if done is not None else _last_end(entry)
                at = entry["t"] - done / 1000.0 if done is not None else entry["t"]
                spawns.append((round(at, 3), f"{doc['id']}/{entry['agent_id']}", at, life, entry))
            for _key, _child, at, life, entry in sorted(spawns, key=lambda s: (s[0], s[1])):
                returns_until(at)
                clock.now = BASE + at
                worker, spawned = f"w{spawned}", spawned + 1
                first = next(r for r in entry["requests"] if r.get("type") in ("n", "s"))
                spawn = {
                    "worker_id": worker, "subagent_type": entry.get("subagent_type") or "",
                    "model": (entry.get("models") or [""])[0], "expected_tokens": first["in"],
                    "background": entry.get("status") == "async_launched",
                }  # fmt: skip
                answer = http.post(f"/v1/sessions/{lead}/workers", json=spawn)
                assert answer.status_code == 201, answer.text
                heapq.heappush(returns, (at + life, worker))
            continue
        returns_until(req["t"])
        nxt = calls[k + 1] if k + 1 < len(calls) else None
        end = req["t"] + (req.get("api_time") or 0.0)
        if nxt is not None:
            end = nxt["t"] - (nxt.get("think_time") or 0.0)
        clock.now = BASE + req["t"]
        history = (
            []
            if k == 0
            else [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
        )
        trace_call = {
            "in": req["in"], "out": req["out"], "end": BASE + end,
            "thinking": "thinking" in (req.get("output_types") or []),
        }  # fmt: skip
        body = {
            "model": req.get("model") or "m",
            "messages": history + _new_input(req.get("input_types") or []),
            "x_trace": trace_call,
        }
        answer = http.post("/v1/chat/completions", json=body, headers={"X-Tenure-Session": lead})
        assert answer.status_code == 200, answer.text
        k += 1
        i += 1
    return str(lead)


def _last_end(entry: dict[str, Any]) -> float:
    """A background agent's lifetime, as the replay takes it (its last call's end)."""
    calls = [r for r in entry["requests"] if r.get("type") in ("n", "s")]
    return float(max(r["t"] + (r.get("api_time") or 0.0) for r in calls))


FIELDS = (
    *parent_features(ParentCall(), WorkerHistory()),
    "session_elapsed_s",
    "sibling_index",
    "subagent_type",
    "model",
    "context_tokens",
    "background",
)


@pytest.fixture(scope="module")
def meta() -> TraceMeta:
    return load_claude_code_meta(Path(claude_code_trace()))


@pytest.mark.parametrize("sid", SESSIONS)
def test_a_replayed_sessions_spawns_see_what_the_replay_derives(replayed, meta: TraceMeta, sid):
    http, ranker, clock = replayed
    doc = _session(sid)
    _replay_through_proxy(http, clock, doc)
    want = [s.record for s in meta.spawns if s.session == sid and s.worker.count("/") == 1]
    got = ranker.records
    assert len(got) == len(want) >= 3
    assert any(w.workers_returned > 0 for w in want)  # the history is exercised
    for n, (live, replay) in enumerate(zip(got, want, strict=True)):
        for name in FIELDS:
            a, b = getattr(live, name), getattr(replay, name)
            if isinstance(b, float):
                assert a == pytest.approx(b, rel=1e-9, abs=1e-6), (sid, n, name)
            else:
                assert a == b, (sid, n, name)
        # The one fact a live spawn cannot have: how many siblings come after it.
        assert live.fanout == live.sibling_index + 1 <= replay.fanout
