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
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from tenure.service.policy import HostTier, Run, TierPolicy, Victim, create_policy
from tenure.service.policy.placement import PlacementPolicy, Route, WorkerSlot, create_placement
from tenure.service.policy.placement import fast_workers as choose_fast
from tenure.service.policy.placement_guard import PlacementGuard
from tenure.service.policy.segments import SegmentClass, SegmentTable, SessionRole, segment_key
from tenure.service.policy.types import EvictionClass
from tenure.service.replay.config import TieringConfig
from tenure.service.replay.model import Turn, slice_runs
from tenure.service.replay.sim_state import SimState
from tenure.service.replay.tier_books import ObservedTier, UseCounts, WriteLedger, pieces

__all__ = ["LowerTier"]

_DEAD = frozenset({EvictionClass.RECLAIM, EvictionClass.TTL})
_CLASSES = tuple(SegmentClass)


class LowerTier:
    """The SSD tier and the placement decisions for one replay run: its state, the I/O path
    the engine calls on every request (routing, lookups, loads, stores, write-back), and the
    session-lifecycle hooks."""

    def __init__(self, sim: SimState, config: TieringConfig) -> None:
        self.sim = sim
        self.config = config
        self.place: PlacementPolicy = create_placement(config.placement)
        self.bt = sim.bt
        self.bb = sim.block_bytes
        self.now = 0.0
        trace = sim.trace
        ssd_bytes = config.ssd.capacity_bytes if config.ssd_bytes is None else config.ssd_bytes
        self.ssd_capacity = int(ssd_bytes // self.bb)
        self.ssd: HostTier = ObservedTier(create_policy("lru"), self.ssd_capacity, self, "ssd")
        notes = config.notes
        self.roles: list[SessionRole] = []
        for s in trace.sessions:
            if s.parent is None:
                self.roles.append(SessionRole.LEAD)
            else:
                role = notes.roles.get(s.id, "worker")
                self.roles.append(SessionRole(role))
        role_class = {
            SessionRole.LEAD: SegmentClass.LEAD,
            SessionRole.WORKER: SegmentClass.WORKER,
            SessionRole.REVIEWER: SegmentClass.REVIEWER,
        }
        self.seg_class: list[SegmentClass] = []
        self.seg_session: list[int] = []
        for seg, owner in enumerate(trace.segment_owner):
            if self.ssd.segment(seg, session=trace.sessions[owner].id) != seg:
                raise AssertionError("segment interning out of order")
            self.seg_class.append(role_class[self.roles[owner]])
            self.seg_session.append(owner)
        self.aware = self.place.lifecycle_aware
        # Spilling a fast-only worker block needs a cascade-on-eviction path to spill through.
        self.spill = config.fast_eviction == "spill" and self.place.cascades_on_eviction()
        self.table = SegmentTable()
        self.uses = UseCounts() if self.place.ssd_min_uses > 1 else None
        self.offers = UseCounts() if self.place.host_min_offers > 1 else None
        # Residency by tier and class (blocks), kept by _ObservedTier.
        self.resident: dict[str, Counter[SegmentClass]] = {"dram": Counter(), "ssd": Counter()}
        self.dram_written: Counter[str] = Counter()  # blocks stored into DRAM, by class
        self.ssd_written: Counter[str] = Counter()  # blocks written to the SSD tier, by class
        # The decomposition: SSD blocks written by (class, cause), rewritten, read back.
        self.ledger = WriteLedger()
        # Blocks materialized (stored into DRAM for the first time), by class: the seed's
        # "write bytes" (newly materialized KV), which a recomputed block does not add to.
        self.seen = WriteLedger()
        self.materialized: Counter[str] = Counter()
        self.write_causes: Counter[tuple[str, str]] = Counter()
        self.rewritten: Counter[str] = Counter()
        self.read_back: Counter[str] = Counter()
        self.turn_of: dict[int, int] = {}  # session -> the turn it is at (every placement)
        self.reasoning_turn: dict[int, tuple[int, int]] = {}  # reasoning seg -> (session, turn)
        self.counters: Counter[str] = Counter()
        self.ssd_read_free_at = 0.0
        self.ssd_write_free_at = 0.0
        self.ssd_write_busy_s = 0.0
        self.max_write_backlog_s = 0.0
        self.peak_ssd_blocks = 0
        # Lifecycle: segments used per session, live users per segment, ends pending.
        self.used_by: dict[int, set[int]] = {}
        self.users: dict[int, set[int]] = {}
        self.ended: set[int] = set()
        self.done_turns: set[int] = set()  # sessions whose last turn completed
        # Sub-agents each session spawns in the trace and that have not returned yet: a lead
        # (or a worker) ends only when its last turn completed and all of them returned (the
        # trace spawns some after the parent's last call).
        self.open_children: Counter[int] = Counter(
            s.parent for s in trace.sessions if s.parent is not None
        )
        self.reasoning_segs: dict[tuple[int, int], int] = {}
        self.reasoning_row: dict[str, int] = {}
        self.fast: frozenset[str] = frozenset()
        self.worker_peak: dict[int, int] = {}
        self.returned_peaks: list[int] = []
        self.spawn_order = 0
        self.slots: dict[str, WorkerSlot] = {}
        self.slot_session: dict[str, int] = {}
        self.live_reviewers: set[int] = set()

    def host_tier(self, policy: TierPolicy, capacity: int) -> HostTier:
        if self.place.guards_fast_tier:
            policy = PlacementGuard(policy, self.pinned_runs)
        self.dram: HostTier = ObservedTier(policy, capacity, self, "dram")
        self.dram_capacity = capacity
        return self.dram

    def pinned_runs(self) -> list[Run]:
        """DRAM runs placement keeps in the fast tier: open reasoning, fast workers, reviewers."""
        runs = [Run(seg, 0, 1 << 40) for seg in self.reasoning_row.values()]
        for row in self.fast:
            runs.extend(Run(seg, 0, 1 << 40) for seg in self._owned(self.slot_session[row]))
        for session in self.live_reviewers:
            runs.extend(Run(seg, 0, 1 << 40) for seg in self._owned(session))
        return runs

    def charge(self, tier: str, seg: int, blocks: int) -> None:
        self.resident[tier][self.seg_class[seg]] += blocks
        if tier == "ssd" and blocks > 0:
            self.peak_ssd_blocks = max(self.peak_ssd_blocks, self.ssd.used)

    def _row(self, session: int) -> str:
        return segment_key(self.sim.trace.sessions[session].id, "context")

    def route(self, seg: int) -> Route:
        cls = self.seg_class[seg]
        fast = cls is SegmentClass.WORKER and self._row(self.seg_session[seg]) in self.fast
        return self.place.route(cls, fast)

    def _write(self, runs: Sequence[Run], session: str, reason: str) -> None:
        """Write the SSD-missing part of ``runs`` to the SSD tier (LRU makes room)."""
        todo = self.ssd.missing(runs)
        if not todo:
            return
        n = sum(r.stop - r.start for r in todo)
        if n > self.ssd_capacity:
            self.counters["ssd_writes_too_large"] += 1
            return
        res = self.ssd.store(todo, session, self.now)
        if not res.admitted:
            self.counters["ssd_writes_refused"] += 1
            return
        for r in todo:
            cls = self.seg_class[r.seg].value
            self.ssd_written[cls] += r.stop - r.start
            self.write_causes[(cls, self._cause(r.seg, reason))] += r.stop - r.start
            self.rewritten[cls] += self.ledger.written(r)
        self.counters[f"ssd_write_blocks_{reason}"] += n
        nbytes = n * self.bb
        seconds = nbytes / self.config.ssd.write_bandwidth
        start = max(self.now, self.ssd_write_free_at)
        self.ssd_write_free_at = start + seconds
        self.ssd_write_busy_s += seconds
        self.max_write_backlog_s = max(self.max_write_backlog_s, self.ssd_write_free_at - self.now)

    def _cause(self, seg: int, reason: str) -> str:
        """Why a block is written: the route, and whether its segment was already dead.

        Dead: reasoning whose session has moved past the turn that decoded it (the harness
        stripped it), or a block of a session whose last turn has completed (a worker that
        returned, a lead that ended). A dead block on the SSD will never be read for a hit
        of its own session.
        """
        owner = self.seg_session[seg]
        rt = self.reasoning_turn.get(seg)
        if rt is not None:
            dead = self.turn_of.get(rt[0], -1) > rt[1] or rt[0] in self.done_turns
        else:
            dead = owner in self.done_turns
        return f"{reason}_{'dead' if dead else 'live'}"

    def on_evicted(self, tier: HostTier, victims: Sequence[Victim]) -> None:
        if tier is self.ssd:
            self.counters["ssd_evicted_blocks"] += sum(v.run.blocks for v in victims)
            return
        for victim in victims:
            run = victim.run
            if victim.cls in _DEAD:
                continue
            route = self.route(run.seg)
            owner = self.sim.trace.sessions[self.seg_session[run.seg]].id
            if route is Route.ON_EVICTION:
                self._write([run], owner, "evicted")
            elif route is Route.FAST_ONLY:
                cls = self.seg_class[run.seg]
                if cls is SegmentClass.WORKER and self.spill:
                    self._write([run], owner, "spilled")
                else:
                    self.counters["fast_dropped_blocks"] += run.blocks

    def lookup(
        self, runs: Sequence[Run], gpu_hit: int, session: str, now: float
    ) -> tuple[int, int]:
        """Consecutive offload hit after the GPU hit: ``(dram blocks, ssd blocks)``.

        SSD-resident parts are promoted into DRAM (a DRAM store) first; if DRAM refuses the
        promotion the prefix stops there, as vLLM's lookup does on a failed allocation.
        """
        self.now = now
        rest = slice_runs(runs, gpu_hit)
        pos = 0
        dram_hit = ssd_hit = 0
        total = sum(r.stop - r.start for r in rest)
        while pos < total:
            tail = slice_runs(rest, pos)
            h = self.dram.lookup(tail)
            if h:
                dram_hit += h
                pos += h
                continue
            s = self.ssd.lookup(tail)
            if not s:
                break
            # vLLM allocates a primary slot per promoted chunk: a prefix longer than DRAM can
            # hold (beside this request's DRAM hits) is promoted as far as it fits.
            s = min(s, max(0, self.dram_capacity - dram_hit - ssd_hit))
            promoted = slice_runs(tail, 0, s)
            res = self.dram.store(promoted, session, now) if s else None
            if res is None or not res.admitted:
                self.counters["promotions_refused"] += 1
                break
            self.ssd.access(promoted, now, session=session)
            for r in promoted:
                self.read_back[self.seg_class[r.seg].value] += self.ledger.read(r)
            self.counters["promoted_blocks"] += s
            ssd_hit += s
            pos += s
            if dram_hit + ssd_hit >= self.dram_capacity:
                self.counters["promotions_capped"] += 1
                break
        return dram_hit, ssd_hit

    def load_done(self, now: float, dram_blocks: int, ssd_blocks: int) -> float:
        """When a load of this many blocks lands in GPU memory (FIFO per channel)."""
        sim = self.sim
        total = (dram_blocks + ssd_blocks) * self.bb
        start = max(now, sim.pcie_free_at)
        sim.pcie_free_at = start + total / sim.hw.load_bandwidth()
        done = sim.pcie_free_at
        if ssd_blocks:
            start = max(now, self.ssd_read_free_at)
            self.ssd_read_free_at = start + ssd_blocks * self.bb / self.config.ssd.read_bandwidth
            done = max(done, self.ssd_read_free_at)
        return done

    def filter_offer(self, runs: Sequence[Run]) -> list[Run]:
        """vLLM ``store_threshold``: only blocks offered at least that many times enter DRAM."""
        if self.offers is None:
            return list(runs)
        out: list[Run] = []
        for run in runs:
            self.offers.bump(run)
            out.extend(self.offers.at_least(run, self.place.host_min_offers))
        self.counters["threshold_skipped_blocks"] += sum(r.blocks for r in runs) - sum(
            r.blocks for r in out
        )
        return out

    def stored(self, pieces: Sequence[Run], session: str, now: float) -> None:
        """``pieces`` were just stored into DRAM by ``session``'s request: write-through."""
        self.now = now
        for piece in pieces:
            cls = self.seg_class[piece.seg].value
            self.dram_written[cls] += piece.blocks
            self.materialized[cls] += piece.blocks - self.seen.written(piece)
        through = [p for p in pieces if self.route(p.seg) is Route.WRITE_THROUGH]
        if not through:
            return
        if self.uses is not None:
            through = [q for p in through for q in self.uses.at_least(p, self.place.ssd_min_uses)]
        if through:
            self._write(through, session, "through")

    def _owned(self, session: int) -> list[int]:
        return list(self.sim.tier.segments_of(self.sim.trace.sessions[session].id))

    def report(self) -> dict[str, Any]:
        sim = self.sim
        res = sim.result
        bb = self.bb
        span = max(res.last_completion_s - res.first_arrival_s, 1e-9)
        ssd_bytes = sum(self.ssd_written.values()) * bb
        dram_bytes = sum(self.dram_written.values()) * bb
        materialized = sum(self.materialized.values())
        first_writes = sum(self.ssd_written.values()) - sum(self.rewritten.values())
        endurance = self.config.ssd.endurance_for(self.ssd_capacity * bb)
        rate = ssd_bytes / span
        hits = self.counters["promoted_blocks"]
        return {
            "placement": self.place.name,
            "routes": self.place.routes(),
            "lifecycle_aware": self.aware,
            "ssd": self.config.ssd.name,
            "ssd_capacity_bytes": self.ssd_capacity * bb,
            "dram_capacity_bytes": self.dram_capacity * bb,
            "span_s": span,
            "dram_write_bytes": {k: v * bb for k, v in sorted(self.dram_written.items())},
            "ssd_write_bytes": {k: v * bb for k, v in sorted(self.ssd_written.items())},
            "dram_write_bytes_total": dram_bytes,
            "ssd_write_bytes_total": ssd_bytes,
            # The seed's Figure 10 share: newly materialized KV never written to the SSD.
            "fast_write_share": 1.0 - first_writes / materialized if materialized else 0.0,
            # Every DRAM store (recomputed blocks again each time) against SSD bytes.
            "fast_store_share": 1.0 - ssd_bytes / dram_bytes if dram_bytes else 0.0,
            "materialized_bytes": {k: v * bb for k, v in sorted(self.materialized.items())},
            "ssd_write_bytes_by_cause": {
                cls: {
                    cause: n * bb for (c, cause), n in sorted(self.write_causes.items()) if c == cls
                }
                for cls in sorted({c for c, _ in self.write_causes})
            },
            "ssd_rewritten_bytes": {k: v * bb for k, v in sorted(self.rewritten.items())},
            "ssd_read_back_bytes": {k: v * bb for k, v in sorted(self.read_back.items())},
            "ssd_write_rate_bytes_per_s": rate,
            "device_years": endurance.device_years(rate),
            "warranty_years": endurance.warranty_years,
            "rated_bytes_written": endurance.rated_bytes_written,
            "ssd_write_utilisation": self.ssd_write_busy_s / span,
            "ssd_max_write_backlog_s": self.max_write_backlog_s,
            "ssd_hit_blocks": hits,
            "ssd_peak_used_bytes": self.peak_ssd_blocks * bb,
            "ssd_used_bytes_at_end": self.ssd.used * bb,
            "dram_used_bytes_at_end": self.dram.used * bb,
            "leaked_segments": len(self.table.leaked()),
            "live_segments_at_end": sum(1 for _ in self.table.live()),
            "ranker": self.config.notes.ranker,
            "counters": dict(sorted(self.counters.items())),
        }

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
