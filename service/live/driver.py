"""Plays a :class:`~tenure.service.live.workload.Workload` through the sidecar as agent sessions.

The same closed loop the simulator runs (:mod:`tenure.service.replay.engine`): root sessions arrive
at their scheduled times; a session's next call goes out its (compressed) gap after the
previous one's answer is in; a sub-agent's first call goes out its gap after the parent call
that spawned it (or the parent's arrival) completed; a parent call that joins sub-agents waits
for every one of them to finish plus the recorded hand-back time, and for its own gap.

Each call is what a harness sends: the ``X-Tenure-Session`` header (and
``X-Tenure-Last-Turn`` on the session's last call), no gap hint (the sidecar predicts it from
the answer it proxies), a streamed chat completion. A call the trace answered with a tool call
asks for one (``tools`` = one ``bash`` tool, ``tool_choice="required"``, no parallel calls), so
vLLM's structured output makes the model's answer a real tool call with finish reason
``tool_calls``; any other call asks for ``answer_words`` words (a ``structured_outputs`` regex)
and ends with finish reason ``stop``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tenure.service.live.dispatch import ClosedLoop, DispatchPlan, Gate
from tenure.service.live.workload import LiveTurn, Workload

__all__ = ["BASH_TOOL", "Driver", "TurnRecord", "request_body"]

#: The one tool of every request that asks for a tool call (no arguments).
BASH_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


def request_body(turn: LiveTurn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": turn.text()}],
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        # Room for the answer and a little more: the grammar ends it, never the limit.
        "max_tokens": turn.output_tokens + 4,
    }
    if turn.tool:
        body.update(tools=[BASH_TOOL], tool_choice="required", parallel_tool_calls=False)
    else:
        body["structured_outputs"] = {"regex": f"(w[0-9]+){{{turn.answer_words}}}"}
    return body


@dataclass(slots=True)
class TurnRecord:
    session: int
    turn: int
    #: Seconds since the run's start (the driver's clock).
    sent: float
    first_token: float = -1.0
    done: float = -1.0
    prompt_tokens: int = 0
    #: Prompt tokens the engine took from a cache (its prefix cache or the host tier), from
    #: the answer's usage (``None``: the engine did not say).
    cached_tokens: int | None = None
    completion_tokens: int = 0
    finish_reason: str | None = None
    tool: str | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.sent

    @property
    def jct_s(self) -> float:
        return self.done - self.sent

    def to_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "turn": self.turn,
            "sent_s": self.sent,
            "ttft_s": self.ttft_s if self.first_token >= 0 else None,
            "jct_s": self.jct_s if self.done >= 0 else None,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "tool": self.tool,
            "error": self.error,
        }


@dataclass
class DriverState:
    """What the progress line reads while the run goes on."""

    started_sessions: set[int] = field(default_factory=set)
    finished_sessions: set[int] = field(default_factory=set)
    turns_done: int = 0
    errors: int = 0


class Driver:
    def __init__(
        self,
        work: Workload,
        proxy_url: str,
        schedule: list[tuple[float, int]],
        *,
        timeout_s: float = 120.0,
        max_connections: int = 64,
        plan: DispatchPlan | None = None,
        gate: Gate | None = None,
    ) -> None:
        self.work = work
        self.url = proxy_url.rstrip("/") + "/v1/chat/completions"
        self.schedule = schedule
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.records: list[TurnRecord] = []
        #: ``(session, turn)`` of every call sent so far (answered or still in flight).
        self.sent: list[tuple[int, int]] = []
        self.state = DriverState()
        self._t0 = 0.0
        self._pending = 0
        self._done = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None
        self._loop = ClosedLoop(work)
        self.plan = plan
        #: ``gate``: one shared by every arm of a side-by-side run (:class:`Gate` with
        #: ``arms``); otherwise this arm's own, from ``plan``.
        self.gate = gate if gate is not None else (Gate(plan) if plan is not None else None)

    def now(self) -> float:
        return time.perf_counter() - self._t0

    async def run(self, on_tick: Callable[[], None] | None = None, tick_s: float = 5.0) -> None:
        limits = httpx.Limits(
            max_connections=self.max_connections,
            max_keepalive_connections=self.max_connections,
            # Below the sidecar's keep-alive timeout (5 s), so a connection is never reused
            # just as the server closes it.
            keepalive_expiry=2.0,
        )
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            self._client = client
            self._t0 = time.perf_counter()
            self._pending = self.work.turns
            for at, root in self.schedule:
                self._at(at, root, 0)
            ticker = asyncio.create_task(self._ticker(on_tick, tick_s)) if on_tick else None
            try:
                await self._done.wait()
            finally:
                if ticker is not None:
                    ticker.cancel()
                for task in list(self._tasks):
                    task.cancel()
                self._client = None

    async def _ticker(self, on_tick: Callable[[], None], tick_s: float) -> None:
        while True:
            await asyncio.sleep(tick_s)
            on_tick()

    def _at(self, when: float, session: int, turn: int) -> None:
        task = asyncio.create_task(self._turn(when, session, turn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _turn(self, when: float, session: int, k: int) -> None:
        delay = when - self.now()
        if delay > 0:
            await asyncio.sleep(delay)
        if self.gate is not None:
            await self.gate.enter((session, k))
        sess = self.work.sessions[session]
        turn = sess.turns[k]
        now = self.now()
        if k == 0:
            self.state.started_sessions.add(session)
            for at, child, first in self._loop.started(session, now):
                self._at(at, child, first)
        record = TurnRecord(session, k, now)
        self.sent.append((session, k))
        await self._send(turn, sess.id, record)
        self.records.append(record)
        self.state.turns_done += 1
        if record.error is not None:
            self.state.errors += 1
        if turn.last:
            self.state.finished_sessions.add(session)
        for at, nxt, j in self._loop.done(session, k, record.done):
            self._at(at, nxt, j)
        if self.gate is not None:
            self.gate.done((session, k))
        self._pending -= 1
        if self._pending == 0:
            self._done.set()

    async def _send(self, turn: LiveTurn, session_id: str, record: TurnRecord) -> None:
        assert self._client is not None
        headers = {"X-Tenure-Session": session_id}
        if turn.last:
            headers["X-Tenure-Last-Turn"] = "true"
        try:
            async with self._client.stream(
                "POST", self.url, json=request_body(turn), headers=headers
            ) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode(errors="replace")
                    record.error = f"HTTP {response.status_code}: {body[:200]}"
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    if record.first_token < 0:
                        # vLLM sends its first chunk once the first token is out (TTFT).
                        record.first_token = self.now()
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    _read_chunk(json.loads(data), record)
        except (httpx.HTTPError, ValueError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            record.done = self.now()
            if record.first_token < 0:
                record.first_token = record.done


def _read_chunk(chunk: dict[str, Any], record: TurnRecord) -> None:
    if "error" in chunk:
        record.error = str(chunk["error"])[:200]
        return
    usage = chunk.get("usage")
    if usage:
        record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        record.completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        # vLLM leaves the details out when nothing was cached.
        record.cached_tokens = int(details.get("cached_tokens") or 0)
    for choice in chunk.get("choices") or ():
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
        for call in (choice.get("delta") or {}).get("tool_calls") or ():
            name = (call.get("function") or {}).get("name")
            if name:
                record.tool = name
