"""An SSD tier below the host-DRAM tier, governed by a placement policy (replay side).

The engine model (:mod:`service.replay.engine`) calls a :class:`LowerTier` at five hooks when a
run has a :class:`TieringConfig`: the host tier is created here (an observed
:class:`~service.policy.tier.HostTier`), prefix lookups continue into the SSD tier, loads pay
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
  (:mod:`service.replay.reasoning`) are decoded KV offloaded to DRAM at the call's end (vLLM with
  ``offload_prompt_only=False``) as a segment of its own, never read again (the harness strips
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
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from service.policy import HostTier, Run, TierPolicy, Victim, create_policy
from service.policy.placement import PlacementPolicy, Route, WorkerSlot, create_placement
from service.policy.placement import fast_workers as choose_fast
from service.policy.placement_guard import PlacementGuard
from service.policy.segments import SegmentClass, SegmentTable, SessionRole, segment_key
from service.policy.types import EvictionClass, StoreResult
from service.replay.hardware import SsdProfile
from service.replay.model import Turn, slice_runs

if TYPE_CHECKING:
    from service.replay.engine import _Sim

__all__ = ["LowerTier", "TieringConfig", "WorkloadNotes"]

_DEAD = frozenset({EvictionClass.RECLAIM, EvictionClass.TTL})
_CLASSES = tuple(SegmentClass)


@dataclass(frozen=True)
class WorkloadNotes:
    """What placement needs that the replay trace model does not carry."""

    #: Session id -> estimated reasoning tokens per turn.
    reasoning_tokens: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    #: Worker session id -> predicted lifetime (seconds) from the ranker at spawn.
    predicted_lifetime_s: Mapping[str, float] = field(default_factory=dict)
    #: Sub-agent session id -> ``worker`` or ``reviewer`` (default ``worker``).
    roles: Mapping[str, str] = field(default_factory=dict)
    #: Name of the ranker the predictions came from (for reports).
    ranker: str = "none"


@dataclass(frozen=True)
class TieringConfig:
    placement: str
    ssd: SsdProfile
    notes: WorkloadNotes = field(default_factory=WorkloadNotes)
    #: SSD tier capacity (default: the whole device).
    ssd_bytes: float | None = None
    #: A fast-only worker block evicted from DRAM: ``spill`` it to the SSD tier (counted) or
    #: ``drop`` it (a later turn recomputes it).
    fast_eviction: str = "spill"

    def __post_init__(self) -> None:
        if self.fast_eviction not in ("spill", "drop"):
            raise ValueError("fast_eviction must be 'spill' or 'drop'")
        create_placement(self.placement)  # fail early on an unknown name


class _ObservedTier(HostTier):
    """A :class:`HostTier` that reports residency changes and evictions to its owner."""

    def __init__(
        self, policy: TierPolicy, capacity: int | None, owner: LowerTier, name: str
    ) -> None:
        self._owner = owner
        self.name = name
        super().__init__(policy, capacity)

    def store(
        self,
        runs: Sequence[Run],
        session: str,
        now: float,
        *,
        misses: Sequence[Run] | None = None,
    ) -> StoreResult:
        self._owner.now = now
        return super().store(runs, session, now, misses=misses)

    def expire(self, now: float) -> list[Victim]:
        self._owner.now = now
        return super().expire(now)

    def _set(self, run: Run) -> None:
        super()._set(run)
        self._owner.charge(self.name, run.seg, run.stop - run.start)

    def _unset(self, run: Run) -> None:
        super()._unset(run)
        self._owner.charge(self.name, run.seg, -(run.stop - run.start))

    def _clear(self, victims: Sequence[Victim]) -> None:
        self._owner.on_evicted(self, victims)
        super()._clear(victims)


class _Counts:
    """Per-block use counts (saturating at 255), one numpy array per segment, grown on demand."""

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray[Any, np.dtype[np.uint8]]] = {}

    def bump(self, run: Run) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], int]:
        """Add one use to ``run``'s blocks; returns the counts before, and the run start."""
        arr = self._arrays.get(run.seg)
        if arr is None or arr.size < run.stop:
            grown = np.zeros(max(run.stop, 2 * (0 if arr is None else arr.size)), np.uint8)
            if arr is not None:
                grown[: arr.size] = arr
            arr = self._arrays[run.seg] = grown
        view = arr[run.start : run.stop]
        before = view.copy()
        np.minimum(view.astype(np.uint16) + 1, 255, out=view, casting="unsafe")
        return before, run.start

    def at_least(self, run: Run, n: int) -> list[Run]:
        """Pieces of ``run`` whose blocks have been used at least ``n`` times."""
        arr = self._arrays.get(run.seg)
        if arr is None:
            return []
        hi = min(run.stop, arr.size)
        if hi <= run.start:
            return []
        return _pieces(run.seg, run.start, arr[run.start : hi] >= n)


def _pieces(seg: int, start: int, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> list[Run]:
    """Maximal runs of ``True`` in ``mask`` (block ``start + i``) as runs of ``seg``."""
    if not mask.any():
        return []
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [
        Run(seg, start + int(a), start + int(b))
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]


class LowerTier:
    """The SSD tier and the placement decisions for one replay run."""

    def __init__(self, sim: _Sim, config: TieringConfig) -> None:
        self.sim = sim
        self.config = config
        self.place: PlacementPolicy = create_placement(config.placement)
        self.bt = sim.bt
        self.bb = sim.block_bytes
        self.now = 0.0
        trace = sim.trace
        ssd_bytes = config.ssd.capacity_bytes if config.ssd_bytes is None else config.ssd_bytes
        self.ssd_capacity = int(ssd_bytes // self.bb)
        self.ssd: HostTier = _ObservedTier(create_policy("lru"), self.ssd_capacity, self, "ssd")
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
        self.uses = _Counts() if self.place.ssd_min_uses > 1 else None
        self.offers = _Counts() if self.place.host_min_offers > 1 else None
        # Residency by tier and class (blocks), kept by _ObservedTier.
        self.resident: dict[str, Counter[SegmentClass]] = {"dram": Counter(), "ssd": Counter()}
        self.dram_written: Counter[str] = Counter()  # blocks stored into DRAM, by class
        self.ssd_written: Counter[str] = Counter()  # blocks written to the SSD tier, by class
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

    # --- wiring ---------------------------------------------------------------------------

    def host_tier(self, policy: TierPolicy, capacity: int) -> HostTier:
        if self.place.guards_fast_tier:
            policy = PlacementGuard(policy, self.pinned_runs)
        self.dram: HostTier = _ObservedTier(policy, capacity, self, "dram")
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

    # --- routes -----------------------------------------------------------------------------

    def _row(self, session: int) -> str:
        return segment_key(self.sim.trace.sessions[session].id, "context")

    def route(self, seg: int) -> Route:
        cls = self.seg_class[seg]
        fast = cls is SegmentClass.WORKER and self._row(self.seg_session[seg]) in self.fast
        return self.place.route(cls, fast)

    # --- SSD writes -----------------------------------------------------------------------

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
            self.ssd_written[self.seg_class[r.seg].value] += r.stop - r.start
        self.counters[f"ssd_write_blocks_{reason}"] += n
        nbytes = n * self.bb
        seconds = nbytes / self.config.ssd.write_bandwidth
        start = max(self.now, self.ssd_write_free_at)
        self.ssd_write_free_at = start + seconds
        self.ssd_write_busy_s += seconds
        self.max_write_backlog_s = max(self.max_write_backlog_s, self.ssd_write_free_at - self.now)

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

    def _resident_pieces(self, tier: HostTier, runs: Sequence[Run]) -> list[Run]:
        out: list[Run] = []
        for run in runs:
            start = run.start
            for gap in tier.missing([run]):
                if gap.start > start:
                    out.append(Run(run.seg, start, gap.start))
                start = gap.stop
            if start < run.stop:
                out.append(Run(run.seg, start, run.stop))
        return out

    # --- hooks called by the engine --------------------------------------------------------

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
            self.dram_written[self.seg_class[piece.seg].value] += piece.blocks
        through = [p for p in pieces if self.route(p.seg) is Route.WRITE_THROUGH]
        if not through:
            return
        if self.uses is not None:
            through = [q for p in through for q in self.uses.at_least(p, self.place.ssd_min_uses)]
        if through:
            self._write(through, session, "through")

    def on_arrival(self, session: int, turn: int, now: float) -> None:
        self.now = now
        sim = self.sim
        sess = sim.trace.sessions[session]
        ctx = sess.turns[turn].context
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

    # --- reasoning ------------------------------------------------------------------------

    def _store_reasoning(self, session: int, turn: int, n: int, now: float) -> None:
        sid = self.sim.trace.sessions[session].id
        key: Hashable = ("reasoning", session, turn)
        seg = self.sim.tier.segment(key, sid)
        if self.ssd.segment(key, sid) != seg:
            raise AssertionError("reasoning segment interning out of order")
        self.seg_class.append(SegmentClass.REASONING)
        self.seg_session.append(session)
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

    # --- lifecycle --------------------------------------------------------------------------

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

    def _owned(self, session: int) -> list[int]:
        return list(self.sim.tier.segments_of(self.sim.trace.sessions[session].id))

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
            due.extend(_pieces(run.seg, start, before == need - 1))
        if due:
            resident = self._resident_pieces(self.dram, due)
            through = [p for p in resident if self.route(p.seg) is Route.WRITE_THROUGH]
            if through:
                self._write(through, sid, "through")

    # --- results ----------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        sim = self.sim
        res = sim.result
        bb = self.bb
        span = max(res.last_completion_s - res.first_arrival_s, 1e-9)
        ssd_bytes = sum(self.ssd_written.values()) * bb
        dram_bytes = sum(self.dram_written.values()) * bb
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
            "fast_write_share": 1.0 - ssd_bytes / dram_bytes if dram_bytes else 0.0,
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
