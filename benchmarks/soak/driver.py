"""Agent sessions from the real trace at a steady rate, through the sidecar replicas.

Each session replays one trace session's main-chain turns: the trace's gap before each turn
(scaled by ``time_scale`` and capped, so a 10-minute soak covers many sessions), the expected
gap declared as a hint, a human-turn gap over ``suspend_above_s`` (in trace seconds) declared
by suspend/resume, the final turn declared as the last, then ``end``. A session is pinned to a
replica by its number; when that replica refuses connections the client skips it for 2 s and
retries on the other (as a load balancer in front of the replicas would); the ledger keeps the
first attempt's outcome and whether the retry succeeded.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from tenure.benchmarks.soak.ledger import Ledger, TurnRecord

__all__ = ["SessionPlan", "drive", "plans_from_trace"]


@dataclass(frozen=True, slots=True)
class SessionPlan:
    #: (gap before the turn in soak seconds, suspended before it, expected gap of the next)
    turns: tuple[tuple[float, bool, float], ...]


def plans_from_trace(
    path: str, *, time_scale: float, max_gap_s: float, suspend_above_s: float, max_turns: int
) -> list[SessionPlan]:
    from pathlib import Path

    from tenure.service.replay.loaders import load_trace

    trace = load_trace(Path(path))
    plans = []
    for session in trace.sessions:
        if session.parent is not None or len(session.turns) < 2:
            continue  # root sessions only: sub-agents are their own sessions in the trace
        turns = session.turns[:max_turns]
        out = []
        for i, turn in enumerate(turns):
            gap = 0.0 if i == 0 else min(max_gap_s, turn.gap_s * time_scale)
            suspended = i > 0 and turns[i - 1].stop == "end_turn" and turn.gap_s > suspend_above_s
            following = turns[i + 1].gap_s * time_scale if i + 1 < len(turns) else 0.0
            out.append((gap, suspended, min(max_gap_s, following)))
        plans.append(SessionPlan(tuple(out)))
    if not plans:
        raise ValueError(f"{path}: no multi-turn sessions")
    return plans


class _Clients:
    def __init__(self, urls: Sequence[str]) -> None:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        timeout = httpx.Timeout(30.0, connect=2.0)
        self.http = [httpx.AsyncClient(base_url=u, timeout=timeout, limits=limits) for u in urls]
        #: A replica that refused a connection is skipped this long (a load balancer's
        #: passive health check), then tried again.
        self.down_until = [0.0] * len(urls)

    def pick(self, preferred: int) -> int:
        now = time.monotonic()
        for step in range(len(self.http)):
            replica = (preferred + step) % len(self.http)
            if self.down_until[replica] <= now:
                return replica
        return preferred

    def mark_down(self, replica: int) -> None:
        self.down_until[replica] = time.monotonic() + 2.0

    async def aclose(self) -> None:
        for client in self.http:
            await client.aclose()


async def _lifecycle(
    clients: _Clients, replica: int, session: str, action: str, body: object, ledger: Ledger,
    t0: float, deadline: float,
) -> None:  # fmt: skip
    """One acknowledged write, retried (either replica) until it is answered 200."""
    attempt = 0
    while time.monotonic() < deadline:
        client = clients.http[(replica + attempt) % len(clients.http)]
        attempt += 1
        try:
            reply = await client.post(f"/v1/sessions/{session}/{action}", json=body)
        except httpx.HTTPError:
            await asyncio.sleep(0.2)
            continue
        if reply.status_code == 200:
            view = reply.json()
            ledger.ack(session, time.monotonic() - t0, str(view["state"]), int(view["turn"]))
            return
        if reply.status_code == 404:
            return  # its turns all failed open (Redis away): nothing stored to write to
        ledger.refused_writes += 1
        await asyncio.sleep(0.2)


async def _session(
    n: int, plan: SessionPlan, clients: _Clients, ledger: Ledger, t0: float, deadline: float
) -> None:
    session = f"soak-{n}"
    replica = n % len(clients.http)
    history = [{"role": "user", "content": f"session {n} turn 0"}]
    for i, (gap, suspended, expected) in enumerate(plan.turns):
        if gap > 0:
            if suspended:
                await _lifecycle(
                    clients, replica, session, "suspend", {"expected_wait_s": max(gap, 1.0)},
                    ledger, t0, deadline,
                )  # fmt: skip
            await asyncio.sleep(gap)
            if suspended:
                await _lifecycle(clients, replica, session, "resume", {}, ledger, t0, deadline)
        if time.monotonic() > deadline:
            return
        last = i == len(plan.turns) - 1
        headers = {
            "X-Tenure-Session": session,
            "X-Tenure-Expected-Gap-Ms": str(int(expected * 1000)),
        }
        if last:
            headers["X-Tenure-Last-Turn"] = "true"
        body = {"model": "tiny", "messages": history[-6:], "max_tokens": 4, "temperature": 0}
        started = time.monotonic()
        status, retried_ok = 0, False
        used = clients.pick(replica)
        for attempt in range(2):
            if attempt:
                used = clients.pick((used + 1) % len(clients.http))
            try:
                reply = await clients.http[used].post(
                    "/v1/chat/completions", json=body, headers=headers
                )
                code = reply.status_code
            except httpx.ConnectError:
                clients.mark_down(used)
                code = 0
            except httpx.HTTPError:
                code = 0
            if attempt == 0:
                status = code
                latency = time.monotonic() - started
            elif code == 200:
                retried_ok = True
            if code == 200 or code not in (0, 502, 503):
                break
        ledger.turns.append(TurnRecord(started - t0, session, status, latency, used, retried_ok))
        history += [
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": f"session {n} turn {i + 1}"},
        ]
    await _lifecycle(clients, replica, session, "end", {}, ledger, t0, deadline)
    ledger.sessions_done += 1


async def drive(
    urls: Sequence[str],
    plans: Sequence[SessionPlan],
    *,
    sessions_per_s: float,
    duration_s: float,
    t0: float,
    ledger: Ledger,
    seed: int = 0,
) -> None:
    """Start sessions at ``sessions_per_s`` for ``duration_s``; wait (bounded) for them."""
    rng = random.Random(seed)
    clients = _Clients(urls)
    tasks: set[asyncio.Task[None]] = set()
    deadline = t0 + duration_s + 30.0  # sessions started late finish or stop here
    n = 0
    try:
        while time.monotonic() - t0 < duration_s:
            plan = plans[rng.randrange(len(plans))]
            task = asyncio.ensure_future(_session(n, plan, clients, ledger, t0, deadline))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
            await asyncio.sleep(rng.expovariate(sessions_per_s))
        if tasks:
            await asyncio.wait(tasks, timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for task in tasks:
            task.cancel()
        await clients.aclose()
