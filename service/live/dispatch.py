"""The order a live arm's calls go out in: the slice's closed loop, and the plan that holds
both arms to one interleaving (issue 28).

Run free, the live arms' interleaving (which calls share the engine's small KV pool, so which
prefixes survive in its own cache between a session's calls) depends on how fast the engine
happens to run on a shared machine, and two identical runs told different stories. So the
calls go out in the order a simulated run of the slice sent them, each once the calls the
simulated engine had finished before it have finished live (:class:`DispatchPlan`,
:class:`Gate`): one interleaving for both arms, and the simulator's.
"""

from __future__ import annotations

import asyncio
import heapq
from dataclasses import dataclass

from tenure.service.live.workload import Workload
from tenure.service.replay.pacing import DispatchPlan, GateRule

__all__ = ["ClosedLoop", "DispatchPlan", "Gate", "plan_dispatch"]


@dataclass(slots=True)
class _Join:
    children: int = 0
    own_done: bool = False
    ready: float = 0.0


class ClosedLoop:
    """The slice's closed-loop rules, with the clock passed in: which calls become due, and
    when, as calls start and finish. The live driver runs them on the wall clock and
    :func:`plan_dispatch` on a simulated one, so both follow one set of rules.

    A session's next call is due its gap after the previous one's answer; a sub-agent's first
    call its gap after the parent call that spawned it finished (or after the parent's first
    call went out, for one spawned on the parent's arrival); a parent call that joins
    sub-agents waits for every one of them to finish plus the recorded hand-back, and for its
    own gap."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self._children: dict[tuple[int, int], list[int]] = {}
        self._joins: dict[tuple[int, int], _Join] = {}
        for i, s in enumerate(work.sessions):
            if s.parent is not None:
                self._children.setdefault((s.parent, s.spawn_after), []).append(i)
                if s.join is not None:
                    self._joins.setdefault((s.parent, s.join[0]), _Join()).children += 1

    def started(self, session: int, now: float) -> list[tuple[float, int, int]]:
        """A session's first call went out at ``now``: the sub-agents it spawns on arrival."""
        sessions = self.work.sessions
        return [
            (now + sessions[c].turns[0].gap_s, c, 0) for c in self._children.get((session, -1), ())
        ]

    def done(self, session: int, k: int, done: float) -> list[tuple[float, int, int]]:
        """Call ``k`` of ``session`` finished at ``done``: ``(when, session, turn)`` of every
        call that became due."""
        sessions = self.work.sessions
        sess = sessions[session]
        due = [
            (done + sessions[c].turns[0].gap_s, c, 0) for c in self._children.get((session, k), ())
        ]
        if sess.turns[k].last:
            if sess.join is not None and sess.parent is not None:
                due += self._join_done(sess.parent, sess.join[0], done + sess.join[1])
            return due
        nxt = k + 1
        own = done + sess.turns[nxt].gap_s
        wait = self._joins.get((session, nxt))
        if wait is None:
            due.append((own, session, nxt))
        else:
            wait.ready = max(wait.ready, own)
            wait.own_done = True
            due += self._release(session, nxt, wait)
        return due

    def _join_done(self, parent: int, turn: int, ready: float) -> list[tuple[float, int, int]]:
        wait = self._joins[(parent, turn)]
        wait.ready = max(wait.ready, ready)
        wait.children -= 1
        return self._release(parent, turn, wait)

    @staticmethod
    def _release(session: int, turn: int, wait: _Join) -> list[tuple[float, int, int]]:
        return [(wait.ready, session, turn)] if wait.own_done and wait.children == 0 else []


def plan_dispatch(
    work: Workload, schedule: list[tuple[float, int]], durations: dict[tuple[int, int], float]
) -> DispatchPlan:
    """:class:`DispatchPlan` of the closed loop played on a simulated clock, each call taking
    its ``durations`` entry (a simulated arm's completion times, per ``(session, turn)``).

    Events at one instant: completions first (what finished at ``t`` has finished for a call
    sent at ``t``), then sends in the order they became due."""
    loop = ClosedLoop(work)
    heap: list[tuple[float, int, int, int, int]] = []  # (time, kind, seq, session, turn)
    seq = 0

    def push(at: float, kind: int, session: int, turn: int) -> None:
        nonlocal seq
        heapq.heappush(heap, (at, kind, seq, session, turn))
        seq += 1

    for at, root in schedule:
        push(at, 1, root, 0)
    sent: list[tuple[int, int]] = []
    finished: list[tuple[int, int]] = []
    before: dict[tuple[int, int], int] = {}
    while heap:
        now, kind, _seq, session, k = heapq.heappop(heap)
        if kind == 0:
            finished.append((session, k))
            for at, s, j in loop.done(session, k, now):
                push(at, 1, s, j)
            continue
        sent.append((session, k))
        before[(session, k)] = len(finished)
        if k == 0:
            for at, s, j in loop.started(session, now):
                push(at, 1, s, j)
        push(now + durations[(session, k)], 0, session, k)
    return DispatchPlan(tuple(sent), tuple(finished), before)


class Gate:
    """Holds each live call until the :class:`DispatchPlan` lets it go: every call before it
    in the plan's order sent, every call the plan had finished before it finished.

    With ``arms`` > 1 one gate serves every arm of a side-by-side run: a call goes out in all
    arms at once, when every arm has it due and the plan's conditions hold in every arm (a
    call counts as finished once it has finished in all of them). So each pair of calls
    meets the same moment of a shared machine (the same background load, the same other
    calls in flight), which is what makes a paired per-call difference cancel the machine's
    noise.

    A call held longer than ``patience_s`` goes anyway (and is counted in ``forced``): a plan
    the live run cannot follow must not hang it (at 120 s, three runs at load average ~45
    let 18-21 of 222 calls go early: 300 s). Waiters park on futures that every change
    resolves (no lock held across an await), so cancelling a run cancels its held calls
    cleanly."""

    def __init__(self, plan: DispatchPlan, patience_s: float = 300.0, arms: int = 1) -> None:
        self._rule = GateRule(plan, arms)
        self._patience = patience_s
        self._waiters: list[asyncio.Future[None]] = []
        #: Seconds calls spent held beyond their own due time (summed over calls and arms),
        #: and calls the limit let go.
        self.held_s = 0.0
        self.forced = 0

    def _changed(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def enter(self, key: tuple[int, int]) -> None:
        rule = self._rule
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._patience
        rule.arrive(key)
        self._changed()
        try:
            while not rule.ready(key):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self.forced += 1
                    break
                fut: asyncio.Future[None] = loop.create_future()
                self._waiters.append(fut)
                await asyncio.wait({fut}, timeout=remaining)
        finally:
            rule.leave(key)
        rule.passed(key)
        self.held_s += loop.time() - started
        self._changed()

    def done(self, key: tuple[int, int]) -> None:
        self._rule.done(key)
        self._changed()
