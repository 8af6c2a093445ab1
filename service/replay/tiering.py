"""An SSD tier below the host-DRAM tier, governed by a placement policy (replay side).

The engine model (:mod:`tenure.service.replay.engine`) calls a :class:`LowerTier` at five hooks when
a run has a :class:`TieringConfig`: the host tier is created here (an observed
:class:`~tenure.service.policy.tier.HostTier`), prefix lookups continue into the SSD tier, loads pay
the SSD's read bandwidth, stores are filtered and written through, and request arrivals and
completions drive the harness boundaries. Everything else (batching, the GPU pool, the DRAM
eviction policy) is the engine model unchanged.

Mechanics, modelled on vLLM 0.32's ``TieringOffloadingManager`` with an ``fs`` secondary tier:

* every block reaches DRAM first (the primary tier is the gateway); an SSD hit is *promoted*
  into DRAM (a DRAM store) before the GPU loads it; the lookup prefix runs across both tiers;
* a load reads its DRAM part over PCIe and its SSD part at the SSD's sequential read bandwidth,
  pipelined (it ends when the slower of the two FIFO channels has moved its bytes);
* SSD writes are off the critical path; their bytes, by segment class, are the endurance spend;
  the write channel's utilisation and backlog are reported (backpressure is not modelled);
* the SSD tier evicts by LRU (vLLM's ``fs`` tier has no eviction at all: it grows unbounded);
* a DRAM victim the DRAM policy declared dead (``reclaim``, ``ttl``) is never cascaded.

Workload the trace does not record, and how it is modelled (stated in every report):

* *reasoning KV*: a reasoning call's estimated reasoning tokens
  (:mod:`tenure.service.replay.reasoning`) are decoded KV offloaded to DRAM at the call's end (vLLM
  with ``offload_prompt_only=False``) as a segment of its own, never read again (the harness strips
  reasoning from the next message) and dead at the session's next turn. The recorded prompts
  are left as they are (Claude Code re-sends its thinking blocks within a tool loop), so the
  carried context is, if anything, overstated.
* *workers*: every sub-agent is a worker (none of the trace's types reviews); a worker's
  predicted lifetime comes from the ranker (:class:`TieringConfig.notes`).

Lifecycle-aware placements free a segment's blocks in both tiers at its boundary: reasoning at
the session's next turn, a worker at its return, a lead when it has ended and its workers have
returned, a rewritten (dead) context tail at the turn that drops it; a segment shared with
another live session (a sibling's system prompt) is freed when its last user ends. Blind
placements leave dead blocks to age out (and a cascade-on-eviction one writes them on the way).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

from tenure.service.policy import Run
from tenure.service.policy.placement import Route, WorkerSlot
from tenure.service.policy.placement import fast_workers as choose_fast
from tenure.service.policy.segments import SegmentClass, SessionRole, segment_key
from tenure.service.replay.model import Turn
from tenure.service.replay.tier_books import pieces
from tenure.service.replay.tiering_io import TierIO

__all__ = ["LowerTier"]


class LowerTier(TierIO):
    """The SSD tier and the placement decisions for one replay run."""

    def on_arrival(self, session: int, turn: int, now: float) -> None:
        self.now = now
        sim = self.sim
        sess = sim.trace.sessions[session]
        ctx = sess.turns[turn].context
        self.turn_of[session] = turn
        if self.uses is not None:
            self._count_uses(ctx, sess.id)
        if not self.aware:
            return
        if turn == 0:
            self._open(session, now)
        elif turn >= 2:
            self._drop_dead_tail(
                session, sess.turns[turn - 2].context, sess.turns[turn - 1 : turn + 1]
            )
        for seg_row in self.table.next_turn(sess.id, turn):
            self._free_reasoning(seg_row.key)
        for run in ctx:
            if run.seg not in self.used_by.setdefault(session, set()):
                self.used_by[session].add(run.seg)
                self.users.setdefault(run.seg, set()).add(session)
        if self.roles[session] is SessionRole.WORKER:
            self.worker_peak[session] = max(
                self.worker_peak.get(session, 0), sess.turns[turn].blocks
            )

    def on_complete(self, session: int, turn: int, now: float) -> None:
        self.now = now
        sess = self.sim.trace.sessions[session]
        tokens = self.config.notes.reasoning_tokens.get(sess.id, ())
        r_tokens = tokens[turn] if turn < len(tokens) else 0
        n = r_tokens // self.bt
        if n > 0:
            self._store_reasoning(session, turn, n, now)
        if sess.turns[turn].last:
            self.done_turns.add(session)
            if self.aware:
                self._try_end(session)

    def _store_reasoning(self, session: int, turn: int, n: int, now: float) -> None:
        sid = self.sim.trace.sessions[session].id
        key: Hashable = ("reasoning", session, turn)
        seg = self.sim.tier.segment(key, sid)
        if self.ssd.segment(key, sid) != seg:
            raise AssertionError("reasoning segment interning out of order")
        self.seg_class.append(SegmentClass.REASONING)
        self.seg_session.append(session)
        self.reasoning_turn[seg] = (session, turn)
        run = Run(seg, 0, n)
        self.counters["reasoning_blocks_decoded"] += n
        offered = self.filter_offer([run])
        if not offered:
            return
        res = self.sim.tier.store(offered, sid, now)
        if not res.admitted:
            self.counters["reasoning_refused_blocks"] += n
            return
        self.stored(offered, sid, now)
        if self.aware:
            row = self.table.open(sid, f"r{turn}", SegmentClass.REASONING)
            self.reasoning_row[row.key] = seg

    def _free_reasoning(self, key: str) -> None:
        seg = self.reasoning_row.pop(key, None)
        if seg is None:
            return
        self._free_segment(seg)

    def _open(self, session: int, now: float) -> None:
        sess = self.sim.trace.sessions[session]
        if sess.parent is None:
            self.table.open_lead(sess.id)
            return
        parent = self.sim.trace.sessions[sess.parent].id
        role = self.roles[session]
        predicted = self.config.notes.predicted_lifetime_s.get(sess.id)
        row = self.table.spawn(sess.id, parent, role, predicted)
        if role is SessionRole.REVIEWER:
            self.live_reviewers.add(session)
        if role is SessionRole.WORKER:
            self.spawn_order += 1
            first = sess.turns[0].blocks
            typical = (
                sorted(self.returned_peaks)[len(self.returned_peaks) // 2]
                if self.returned_peaks
                else 0
            )
            self.slots[row.key] = WorkerSlot(
                row.key,
                math.inf if predicted is None else predicted,
                max(first, typical),
                self.spawn_order,
            )
            self.slot_session[row.key] = session
            self._rerank()

    def _rerank(self) -> None:
        if not self.place.ranks_workers:
            return
        pinned = self.resident["dram"][SegmentClass.REASONING]
        pinned += self.resident["dram"][SegmentClass.REVIEWER]
        # DRAM is the gateway for SSD reads: leave room to stage the largest live context.
        staging = max(self.sim.live_blocks.values(), default=0)
        fast = choose_fast(self.slots.values(), self.dram_capacity - pinned - staging)
        if fast != self.fast:
            self.counters["rerankings"] += 1
        self.fast = fast

    def _try_end(self, session: int) -> None:
        """End ``session`` once its last turn completed and its children have ended."""
        if session in self.ended or session not in self.done_turns:
            return
        if self.open_children[session] > 0:
            return
        sess = self.sim.trace.sessions[session]
        if sess.parent is None:
            closed = self.table.end_session(sess.id)
        else:
            closed = self.table.worker_return(sess.id)
            context = segment_key(sess.id, "context")
            self.live_reviewers.discard(session)
            if self.slots.pop(context, None) is not None:
                del self.slot_session[context]
                self.returned_peaks.append(self.worker_peak.get(session, 0))
                self._rerank()
        for row in closed:
            self._free_reasoning(row.key)
        self.ended.add(session)
        used = self.used_by.pop(session, set())
        for seg in used:
            users = self.users.get(seg)
            if users is not None:
                users.discard(session)
        # Free what only ended sessions use: this session's own segments and the shared
        # segments of ended owners it was the last user of (a live user frees them later).
        for seg in used | set(self._owned(session)):
            if self.seg_session[seg] in self.ended and not self.users.get(seg):
                self.users.pop(seg, None)
                self._free_segment(seg)
        if sess.parent is not None:
            self.open_children[sess.parent] -= 1
            self._try_end(sess.parent)

    def _free_segment(self, seg: int) -> None:
        whole = [Run(seg, 0, 1 << 40)]
        freed = self.sim.tier.drop(whole) + self.ssd.drop(whole)
        self.counters["freed_blocks"] += freed

    def _drop_dead_tail(self, session: int, old: Sequence[Run], later: Sequence[Turn]) -> None:
        """Free the tail of ``old`` (a context two turns back) that neither later turn uses.

        The trace holds single calls whose context strays from its neighbours' and the next
        call comes back, so a rewritten tail is freed only once a second turn confirms it.
        """
        kept: dict[int, int] = {}
        for turn in later:
            for seg, _start, stop in turn.context:
                kept[seg] = max(kept.get(seg, 0), stop)
        owner = self.sim.trace.segment_owner
        prev = old
        # A tail another live session has used (a sub-agent forked from it) stays.
        dead = [
            Run(seg, kept.get(seg, 0), stop)
            for seg, _start, stop in prev
            if owner[seg] == session
            and kept.get(seg, 0) < stop
            and not (self.users.get(seg, set()) - {session})
        ]
        if dead:
            self.counters["dead_tail_blocks"] += self.sim.tier.drop(dead) + self.ssd.drop(dead)

    def _count_uses(self, ctx: Sequence[Run], sid: str) -> None:
        """Dynamo's filter: a DRAM-resident block used for the ``n``-th time is written now."""
        assert self.uses is not None
        need = self.place.ssd_min_uses
        due: list[Run] = []
        for run in ctx:
            before, start = self.uses.bump(run)
            due.extend(pieces(run.seg, start, before == need - 1))
        if due:
            resident = self.dram.resident(due)
            through = [p for p in resident if self.route(p.seg) is Route.WRITE_THROUGH]
            if through:
                self._write(through, sid, "through")
