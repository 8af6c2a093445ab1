"""The replay's workload: root arrivals, the session graph (spawns, joins) and closed-loop turns.

Root sessions arrive as a Poisson process (one ``random.Random(seed)``, so paired runs share
arrivals); each next turn of a session arrives its gap after the previous one completed, once
every sub-agent it joins on is done. Hints go to the host tier at a turn's start (and its
completion, for predicted gaps). The live working set is sampled at every change.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from tenure.service.policy import SessionHint, stop_class
from tenure.service.policy.types import Run
from tenure.service.replay.model import slice_runs
from tenure.service.replay.requests import Join, Request
from tenure.service.replay.sim_state import ARRIVAL, SimState

__all__ = ["Workload"]


class Workload:
    """Arrivals, completions and the session graph of one run.

    A new request is appended to the shared queue (``sim.waiting``); the engine's loop tells
    the batching model. A finished one comes back through :meth:`complete`.
    """

    def __init__(self, sim: SimState) -> None:
        """Parent/child links, joins and roots of the trace's sessions."""
        self.sim = sim
        trace = sim.trace
        n = len(trace.sessions)
        self.prev_done = [0.0] * n  # completion time of the session's latest turn
        self.prev_stop: list[str | None] = [None] * n
        self.join_wait: dict[tuple[int, int], Join] = {}  # (session, turn) -> its join
        self.children: dict[tuple[int, int], list[int]] = {}
        for i, s in enumerate(trace.sessions):
            if s.parent is not None:
                self.children.setdefault((s.parent, s.spawn_after), []).append(i)
                if s.join is not None:
                    key = (s.parent, s.join[0])
                    self.join_wait.setdefault(key, Join()).children += 1
        self.root_of = [0] * n
        for i, s in enumerate(trace.sessions):
            self.root_of[i] = i if s.parent is None else self.root_of[s.parent]
        # Live working set: a step function sampled at every change (blocks in sim.live_blocks).
        self.live_total = 0
        self.ws_samples: list[tuple[float, int, int]] = []
        self.done_turns = 0
        self.skipped: set[int] = set()

    # --- arrivals -----------------------------------------------------------------------------

    def schedule_roots(self) -> None:
        rng = random.Random(self.sim.config.seed)
        pool = self.sim.hw.kv_pool_blocks(self.sim.bt)
        oversize: set[int] = set()
        for i, s in enumerate(self.sim.trace.sessions):
            for t in s.turns:
                if t.blocks + self._extra_blocks(t.input_tokens, t.blocks, t.output_tokens) > pool:
                    oversize.add(self.root_of[i])
                    break
        self.skipped = oversize
        roots = [i for i in self.sim.trace.roots if i not in oversize]
        self.sim.result.sessions_skipped_oversize = len(oversize)
        self.sim.result.sessions_run = sum(
            1 for i in range(len(self.sim.trace.sessions)) if self.root_of[i] not in oversize
        )
        rng.shuffle(roots)
        clock = 0.0
        for root in roots:
            clock += rng.expovariate(self.sim.config.arrival_rate)
            self.sim.push(clock, ARRIVAL, (root, 0))
        self.sim.result.first_arrival_s = math.inf

    def _extra_blocks(self, tokens_in: int, blocks: int, tokens_out: int) -> int:
        tail = tokens_in - blocks * self.sim.bt + max(tokens_out, 1)
        return -(-tail // self.sim.bt)

    def on_arrival(self, now: float, session: int, k: int) -> None:
        sess = self.sim.trace.sessions[session]
        turn = sess.turns[k]
        sid = sess.id
        self.sim.result.first_arrival_s = min(self.sim.result.first_arrival_s, now)
        if k == 0:
            for child in self.children.get((session, -1), ()):
                spawn = now + self.sim.trace.sessions[child].turns[0].gap_s
                self.sim.push(spawn, ARRIVAL, (child, 0))
        else:
            self.sim.gaps.observe(self.prev_stop[session], now - self.prev_done[session])
            if self.sim.drop_dead_tails:
                self._drop_dead(session, sess.turns[k - 1].context, turn.context)
        if self.sim.lower is not None:
            self.sim.lower.on_arrival(session, k, now)
        self._set_live(now, session, turn.blocks)
        req = Request(session, k, now, turn.context)
        req.extra_blocks = self._extra_blocks(turn.input_tokens, req.n_blocks, turn.output_tokens)
        self.sim.tier.request_start(sid, now)
        if self.sim.hint_source != "none":
            declared = turn.last and self.sim.config.ends == "declared"
            if self.sim.hint_source == "exact":
                gap = None if turn.last else sess.turns[k + 1].gap_s
            else:
                gap = None if declared else self._predict(self.prev_stop[session])
            self.sim.tier.hint(sid, SessionHint(expected_gap_s=gap, last_turn=declared), now)
            self.sim.arm_timer(now)
        self.sim.waiting.append(req)

    # --- completion -------------------------------------------------------------------------

    def complete(self, req: Request, now: float) -> None:
        session = req.session
        sess = self.sim.trace.sessions[session]
        turn = sess.turns[req.turn]
        sid = sess.id
        self.sim.running.remove(req)
        req.done_s = now
        used = slice_runs(req.runs, req.access_start, req.n_blocks)
        self.sim.tier.access(used, now, session=sid, inserted=req.inserted)
        self.sim.gpu.release(req.runs, req.extra_blocks)
        if self.sim.lower is not None:
            self.sim.lower.on_complete(session, req.turn, now)
        declared = turn.last and self.sim.config.ends == "declared"
        if (
            self.sim.hint_source != "none"
            and self.sim.config.ends == "inferred"
            and turn.likely_end
        ):
            self.sim.tier.hint(sid, SessionHint(likely_end=True), now)
        elif self.sim.hint_source == "predicted" and not declared:
            gap = self._predict(turn.stop)
            self.sim.tier.hint(sid, SessionHint(expected_gap_s=gap), now)
        self.sim.arm_timer(now)
        self.sim.result.record(self.root_of[session], req, turn.seen_blocks, now, self.sim.bt)
        self.prev_done[session] = now
        self.prev_stop[session] = turn.stop
        self.done_turns += 1
        if self.sim.progress is not None and self.done_turns % 1000 == 0:
            self.sim.progress(1000)
        for child in self.children.get((session, req.turn), ()):
            self.sim.push(now + self.sim.trace.sessions[child].turns[0].gap_s, ARRIVAL, (child, 0))
        if turn.last:
            self._set_live(now, session, None)
            if sess.join is not None and sess.parent is not None:
                self._join_done(sess.parent, sess.join[0], now + sess.join[1])
            return
        nxt = req.turn + 1
        wait = self.join_wait.get((session, nxt))
        own = now + sess.turns[nxt].gap_s
        if wait is None:
            self.sim.push(own, ARRIVAL, (session, nxt))
        else:
            wait.ready = max(wait.ready, own)
            wait.own_done = True
            self._maybe_release(session, nxt, wait)

    def _predict(self, stop: str | None) -> float | None:
        # Without a stop reason the predictor's answer is one stop-blind median for everyone;
        # a policy that learns gaps itself (per session) is better served by no gap at all.
        if self.sim.learns_gaps and stop_class(stop) == "other":
            return None
        return self.sim.gaps.predict(stop)

    def _join_done(self, parent: int, turn: int, ready: float) -> None:
        wait = self.join_wait[(parent, turn)]
        wait.ready = max(wait.ready, ready)
        wait.children -= 1
        self._maybe_release(parent, turn, wait)

    def _maybe_release(self, session: int, turn: int, wait: Join) -> None:
        # The turn arrives once its own gap has begun and every joined child is done.
        if wait.own_done and wait.children == 0:
            self.sim.push(wait.ready, ARRIVAL, (session, turn))

    def _drop_dead(self, session: int, prev: Sequence[Run], new: Sequence[Run]) -> None:
        kept = {seg: stop for seg, _start, stop in new}
        owner = self.sim.trace.segment_owner
        dead = [
            Run(seg, kept.get(seg, 0), stop)
            for seg, _start, stop in prev
            if owner[seg] == session and kept.get(seg, 0) < stop
        ]
        if dead:
            self.sim.tier.drop(dead)

    # --- live working set -------------------------------------------------------------------

    def _set_live(self, now: float, session: int, blocks: int | None) -> None:
        old = self.sim.live_blocks.pop(session, 0)
        self.live_total -= old
        if blocks is not None:
            self.sim.live_blocks[session] = blocks
            self.live_total += blocks
        self.ws_samples.append((now, self.live_total, len(self.sim.live_blocks)))
