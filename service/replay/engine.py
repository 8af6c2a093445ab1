"""A deterministic discrete-event model of one vLLM engine with a policy-governed host tier.

``simulate(trace, config) -> RunResult``. Events are ordered by ``(time, kind, sequence)``; the
only randomness (Poisson session arrivals and the order sessions arrive in) comes from one
``random.Random(seed)``, so paired runs of different policies share arrivals and gaps.

Engine: continuous batching with chunked prefill (decodes first, then prefill chunks in
admission order up to ``max_num_batched_tokens``). Time advances span to span: a span is a run
of identical engine steps (same batch, same chunk sizes) whose length is the number of steps
until the batch must change (a prefill finishes, a decode finishes, or a request arrives or
finishes loading, which truncates the span at the next step boundary). Step time is the
hardware roofline (:mod:`service.replay.hardware`) at the span's mean positions.

GPU pool: :class:`~service.replay.gpu_pool.GpuPrefixCache`. Host tier:
:class:`~service.policy.tier.HostTier` governed by the policy under test, with loads on the
critical path of a request at PCIe bandwidth (FIFO over one host->GPU link) and stores off it.

Which calls count as a use of a host block (vLLM 0.32's ``OffloadingConnectorScheduler`` with
``CPUOffloadingManager``, default ``offload_prompt_only=True``, ``store_threshold`` off):

* Lookup (``get_num_new_matched_tokens``) starts at the local GPU prefix hit ``G`` and counts
  consecutive resident host blocks ``H``; ``lookup`` itself is a pure query (no recency).
* If ``H > 0`` the blocks ``[G, G+H)`` are loaded (``prepare_load``: recorded as *reused*) and
  the request's store cursor jumps to ``G+H`` (``update_state_after_alloc``, chunk-level policy):
  the GPU-hit head ``[0, G)`` is neither offered nor recorded, so it is *not* used.
* If ``H == 0`` the store cursor stays at 0: the first ``prepare_store`` offers the GPU-hit
  head too. Offered blocks already resident are recorded as *reused* (a use); missing ones are
  inserted (``insert`` = a use); so a request that hits its prefix in the GPU pool *does* touch
  (or re-store) that prefix in the host tier.
* Stores are offered as prompt blocks are computed, all-or-nothing per offer; a refused offer
  does not advance the cursor, so the same blocks are offered again at the next step (here: the
  next span) until one is admitted or the request ends.
* At the end of the request ``on_request_finished`` touches every recorded block (loaded and
  offered) in prefix order: ``HostTier.access`` over ``[cursor start, prompt blocks)`` with the
  runs the request inserted itself (ARC tells insertions from reuses).

Hints by ``policy_class(name).hint_source``: ``predicted`` — at a request's start the expected
gap after it is predicted from the previous response's stop reason by a
:class:`~service.policy.gap.GapPredictor` trained online on the gaps observed so far in this
run, refined at completion with the response's own stop reason; ``exact`` — the true next gap
from the trace; ``none`` — no hints. ``last_turn`` is declared on a session's final request for
every hint-using policy. Hint-using policies also get the harness's view of a divergence: when
a session's new call no longer uses the tail of a segment its previous call used (a compaction,
a rewritten last block), that dead tail is dropped from the host tier at once
(``HostTier.drop``); hint-blind policies, like vLLM, leave it to age out.

Sessions whose largest call cannot fit the GPU KV pool are skipped whole (and counted): vLLM
would reject such a prompt.

With ``ReplayConfig.tiering`` an SSD tier sits below the host tier, governed by a placement
policy: :mod:`service.replay.tiering` creates the host tier and is called at the lookup, load,
store, arrival and completion hooks marked ``self.lower`` (nothing changes without it).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from array import array
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from service.policy import GapPredictor, HostTier, SessionHint, create_policy, policy_class
from service.policy.types import Run
from service.replay.gpu_pool import GpuPrefixCache
from service.replay.hardware import GIB, HardwareProfile
from service.replay.model import Trace, slice_runs

if TYPE_CHECKING:
    from service.replay.tiering import LowerTier, TieringConfig

__all__ = ["ReplayConfig", "RunResult", "simulate"]

# Event kinds, in processing order at equal times: finish steps before admitting newcomers.
_TIMER, _STEP, _LOAD, _ARRIVAL = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    policy: str
    hardware: HardwareProfile
    host_gib: float
    arrival_rate: float  # root sessions per second (Poisson)
    seed: int
    policy_params: Mapping[str, float] | None = None
    #: An SSD tier below the host tier and its placement (``None``: the host tier only).
    tiering: TieringConfig | None = None


@dataclass(slots=True)
class RunResult:
    """Raw outcome of one run: per-turn arrays (completion order) and run totals."""

    policy: str
    seed: int
    turn_root: array[int] = field(default_factory=lambda: array("q"))
    turn_session: array[int] = field(default_factory=lambda: array("q"))
    turn_index: array[int] = field(default_factory=lambda: array("q"))
    ttft_s: array[float] = field(default_factory=lambda: array("d"))
    jct_s: array[float] = field(default_factory=lambda: array("d"))
    host_hit_tokens: array[int] = field(default_factory=lambda: array("q"))
    reusable_tokens: array[int] = field(default_factory=lambda: array("q"))
    prefill_tokens: array[int] = field(default_factory=lambda: array("q"))
    gpu_hit_tokens: array[int] = field(default_factory=lambda: array("q"))
    first_arrival_s: float = 0.0
    last_completion_s: float = 0.0
    host_bytes_stored: float = 0.0
    host_bytes_loaded: float = 0.0
    host_capacity_blocks: int = 0
    gpu_capacity_blocks: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    p95_live_sessions: float = 0.0
    p95_live_working_set_gib: float = 0.0
    sessions_skipped_oversize: int = 0
    sessions_run: int = 0
    #: The SSD tier's report (:meth:`service.replay.tiering.LowerTier.report`), when modelled.
    tiering: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return len(self.jct_s)


class _Request:
    __slots__ = (
        "access_start",
        "arrival",
        "computed",
        "decode_left",
        "extra_blocks",
        "first_token",
        "gpu_hit",
        "host_hit",
        "inserted",
        "n_blocks",
        "offer_idx",
        "prefill_left",
        "prefilled",
        "refused_at",
        "runs",
        "session",
        "turn",
    )

    def __init__(self, session: int, turn: int, arrival: float, runs: tuple[Run, ...]) -> None:
        self.session = session
        self.turn = turn
        self.arrival = arrival
        self.runs = runs
        self.n_blocks = sum(r.stop - r.start for r in runs)
        self.gpu_hit = 0
        self.host_hit = 0
        self.extra_blocks = 0
        self.computed = 0  # prompt tokens whose KV exists (cached, loaded or prefilled)
        self.prefill_left = 0
        self.prefilled = 0  # prompt tokens this request computes itself
        self.decode_left = 0
        self.first_token = -1.0
        self.offer_idx = 0
        self.refused_at = -1  # prompt blocks computed when an offer was last refused
        self.access_start = 0
        self.inserted: list[Run] = []


@dataclass(slots=True)
class _Join:
    """A parent turn that waits for sub-agents (and for its own gap) before it arrives."""

    children: int = 0
    own_done: bool = False
    ready: float = 0.0


class _Sim:
    def __init__(
        self, trace: Trace, config: ReplayConfig, progress: Callable[[int], None] | None
    ) -> None:
        self.trace = trace
        self.config = config
        self.hw = config.hardware
        self.bt = trace.block_tokens
        self.block_bytes = self.bt * self.hw.kv_bytes_per_token
        self.progress = progress
        cls = policy_class(config.policy)
        self.hint_source = cls.hint_source
        # A lifecycle-aware deployment sees a session's new request diverge from its previous
        # one (a compaction, a rewritten last block) and drops the dead tail at once; vLLM's
        # own policies leave it to age out.
        self.drop_dead_tails = cls.hint_source != "none"
        policy = create_policy(config.policy, config.policy_params)
        capacity = int(config.host_gib * GIB // self.block_bytes)
        self.lower: LowerTier | None = None
        if config.tiering is None:
            self.tier = HostTier(policy, capacity)
        else:
            from service.replay.tiering import LowerTier

            self.lower = LowerTier(self, config.tiering)
            self.tier = self.lower.host_tier(policy, capacity)
        for seg, owner in enumerate(trace.segment_owner):
            got = self.tier.segment(seg, session=trace.sessions[owner].id)
            if got != seg:
                raise AssertionError("segment interning out of order")
        self.gpu = GpuPrefixCache(self.hw.kv_pool_blocks(self.bt), len(trace.segment_owner))
        self.gaps = GapPredictor()
        self.result = RunResult(policy=config.policy, seed=config.seed)
        self.result.host_capacity_blocks = capacity
        self.result.gpu_capacity_blocks = self.gpu.capacity
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.loading = 0
        self.pcie_free_at = 0.0
        self.timer_at: float | None = None
        # The span in progress: (start, steps, step seconds, decodes, chunks, generation).
        self.span: tuple[float, int, float, list[_Request], list[tuple[_Request, int]]] | None = (
            None
        )
        self.span_gen = 0
        # Per-session closed-loop bookkeeping.
        n = len(trace.sessions)
        self.prev_done = [0.0] * n  # completion time of the session's latest turn
        self.prev_stop: list[str | None] = [None] * n
        self.join_wait: dict[tuple[int, int], _Join] = {}  # (session, turn) -> its join
        self.children: dict[tuple[int, int], list[int]] = {}
        for i, s in enumerate(trace.sessions):
            if s.parent is not None:
                self.children.setdefault((s.parent, s.spawn_after), []).append(i)
                if s.join is not None:
                    key = (s.parent, s.join[0])
                    self.join_wait.setdefault(key, _Join()).children += 1
        self.root_of = [0] * n
        for i, s in enumerate(trace.sessions):
            self.root_of[i] = i if s.parent is None else self.root_of[s.parent]
        # Live working set: a step function sampled at every change.
        self.live_blocks: dict[int, int] = {}
        self.live_total = 0
        self.ws_samples: list[tuple[float, int, int]] = []
        self.done_turns = 0
        self.skipped: set[int] = set()

    # --- event queue ------------------------------------------------------------------------

    def push(self, time: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time, kind, self.seq, payload))

    def arm_timer(self, now: float) -> None:
        nxt = self.tier.policy.next_timer()
        if nxt is None:
            return
        nxt = max(nxt, now)
        if self.timer_at is None or nxt < self.timer_at:
            self.timer_at = nxt
            self.push(nxt, _TIMER, None)

    # --- arrivals -----------------------------------------------------------------------------

    def schedule_roots(self) -> None:
        rng = random.Random(self.config.seed)
        pool = self.hw.kv_pool_blocks(self.bt)
        oversize: set[int] = set()
        for i, s in enumerate(self.trace.sessions):
            for t in s.turns:
                if t.blocks + self._extra_blocks(t.input_tokens, t.blocks, t.output_tokens) > pool:
                    oversize.add(self.root_of[i])
                    break
        self.skipped = oversize
        roots = [i for i in self.trace.roots if i not in oversize]
        self.result.sessions_skipped_oversize = len(oversize)
        self.result.sessions_run = sum(
            1 for i in range(len(self.trace.sessions)) if self.root_of[i] not in oversize
        )
        rng.shuffle(roots)
        clock = 0.0
        for root in roots:
            clock += rng.expovariate(self.config.arrival_rate)
            self.push(clock, _ARRIVAL, (root, 0))
        self.result.first_arrival_s = math.inf

    def _extra_blocks(self, tokens_in: int, blocks: int, tokens_out: int) -> int:
        tail = tokens_in - blocks * self.bt + max(tokens_out, 1)
        return -(-tail // self.bt)

    def on_arrival(self, now: float, session: int, k: int) -> None:
        sess = self.trace.sessions[session]
        turn = sess.turns[k]
        sid = sess.id
        self.result.first_arrival_s = min(self.result.first_arrival_s, now)
        if k == 0:
            for child in self.children.get((session, -1), ()):
                self.push(now + self.trace.sessions[child].turns[0].gap_s, _ARRIVAL, (child, 0))
        else:
            self.gaps.observe(self.prev_stop[session], now - self.prev_done[session])
            if self.drop_dead_tails:
                self._drop_dead(session, sess.turns[k - 1].context, turn.context)
        if self.lower is not None:
            self.lower.on_arrival(session, k, now)
        self._set_live(now, session, turn.blocks)
        req = _Request(session, k, now, turn.context)
        req.extra_blocks = self._extra_blocks(turn.input_tokens, req.n_blocks, turn.output_tokens)
        self.tier.request_start(sid, now)
        if self.hint_source != "none":
            if self.hint_source == "exact":
                gap = None if turn.last else sess.turns[k + 1].gap_s
            else:
                gap = None if turn.last else self.gaps.predict(self.prev_stop[session])
            self.tier.hint(sid, SessionHint(expected_gap_s=gap, last_turn=turn.last), now)
            self.arm_timer(now)
        self.waiting.append(req)
        self.poke(now)

    def poke(self, now: float) -> None:
        """Something joined the queue: end the current span at the next step boundary."""
        if self.span is None:
            self.start_span(now)
            return
        start, steps, dt, decodes, chunks = self.span
        done = max(1, math.ceil((now - start) / dt - 1e-9)) if dt > 0 else steps
        if done < steps:
            self.span = (start, done, dt, decodes, chunks)
            self.span_gen += 1
            self.push(start + done * dt, _STEP, self.span_gen)

    # --- admission and loads ------------------------------------------------------------------

    def admit(self, now: float) -> None:
        limit = self.hw.max_num_seqs
        while self.waiting and len(self.running) + self.loading < limit:
            req = self.waiting[0]
            g = self.gpu.hit(req.runs)
            if not self.gpu.admit(req.runs, req.extra_blocks):
                return  # FCFS: the head waits until it fits
            self.waiting.popleft()
            req.gpu_hit = g
            ssd_hit = 0
            if g >= req.n_blocks:
                h = 0
            elif self.lower is None:
                h = self.tier.lookup(slice_runs(req.runs, g))
            else:
                sid = self.trace.sessions[req.session].id
                h, ssd_hit = self.lower.lookup(req.runs, g, sid, now)
                h += ssd_hit
            req.host_hit = h
            turn = self.trace.sessions[req.session].turns[req.turn]
            cached = (g + h) * self.bt
            if cached >= turn.input_tokens:
                cached = turn.input_tokens - 1  # vLLM recomputes the last prompt token
            req.computed = cached
            req.prefill_left = req.prefilled = turn.input_tokens - cached
            req.decode_left = max(turn.output_tokens, 1)
            req.offer_idx = req.access_start = g + h if h > 0 else 0
            if h > 0:
                nbytes = h * self.block_bytes
                self.result.host_bytes_loaded += nbytes
                if self.lower is None:
                    start = max(now, self.pcie_free_at)
                    self.pcie_free_at = start + nbytes / self.hw.load_bandwidth()
                    done = self.pcie_free_at
                else:
                    done = self.lower.load_done(now, h - ssd_hit, ssd_hit)
                self.loading += 1
                self.push(done, _LOAD, req)
            else:
                self.running.append(req)

    def on_load(self, now: float, req: _Request) -> None:
        self.loading -= 1
        self.running.append(req)
        self.poke(now)

    # --- engine spans -------------------------------------------------------------------------

    def start_span(self, now: float) -> None:
        self.admit(now)
        if not self.running:
            self.span = None
            return
        budget = self.hw.max_num_batched_tokens
        decodes = [r for r in self.running if r.prefill_left == 0]
        budget -= len(decodes)
        chunks: list[tuple[_Request, int]] = []
        steps = math.inf
        for r in decodes:
            steps = min(steps, r.decode_left)
        for r in self.running:
            if r.prefill_left > 0 and budget > 0:
                c = min(r.prefill_left, budget)
                budget -= c
                chunks.append((r, c))
                steps = min(steps, r.prefill_left // c)
        steps_i = max(1, int(steps))
        half = (steps_i - 1) / 2.0
        tokens = len(decodes)
        attn = 0.0
        kv = 0.0
        for r in decodes:
            turn = self.trace.sessions[r.session].turns[r.turn]
            ctx = turn.input_tokens + (turn.output_tokens - r.decode_left) + half
            attn += ctx
            kv += ctx
        for r, c in chunks:
            pos = r.computed + c * half
            tokens += c
            attn += c * (pos + c / 2.0)
            kv += pos + c
        dt = self.hw.step_seconds(tokens, attn, kv)
        self.span = (now, steps_i, dt, decodes, chunks)
        self.span_gen += 1
        self.push(now + steps_i * dt, _STEP, self.span_gen)

    def on_step(self, now: float, gen: int) -> None:
        if gen != self.span_gen or self.span is None:
            return  # superseded by a truncation
        _start, steps, _dt, decodes, chunks = self.span
        self.span = None
        finished: list[_Request] = []
        for r in decodes:
            r.decode_left -= steps
            if r.decode_left <= 0:
                finished.append(r)
        for r, c in chunks:
            r.prefill_left -= steps * c
            r.computed += steps * c
            if r.prefill_left <= 0:
                r.prefill_left = 0
                r.first_token = now
                r.decode_left -= 1  # the last prefill step samples the first token
                if r.decode_left <= 0:
                    finished.append(r)
        for r in self.running:
            if r.offer_idx < r.n_blocks:
                self.offer(r, now)
        for r in finished:
            self.complete(r, now)
        self.start_span(now)

    def offer(self, req: _Request, now: float) -> None:
        done = min(req.n_blocks, req.computed // self.bt)
        if done <= req.offer_idx or done == req.refused_at:
            # vLLM re-offers a refused range every step; with nothing new computed the answer
            # cannot change (a gate keeps refusing the request, and an eviction policy only
            # refuses an offer larger than what it could ever free), so skip the repeat.
            return
        runs = slice_runs(req.runs, req.offer_idx, done)
        if self.lower is not None:
            runs = self.lower.filter_offer(runs)
        missing = self.tier.missing(runs)
        sid = self.trace.sessions[req.session].id
        res = self.tier.store(runs, sid, now)
        if res.admitted:
            req.offer_idx = done
            req.inserted.extend(missing)
            self.result.host_bytes_stored += res.stored_blocks * self.block_bytes
            if self.lower is not None:
                self.lower.stored(missing, sid, now)
        else:
            req.refused_at = done
        self.arm_timer(now)

    # --- completion -------------------------------------------------------------------------

    def complete(self, req: _Request, now: float) -> None:
        session = req.session
        sess = self.trace.sessions[session]
        turn = sess.turns[req.turn]
        sid = sess.id
        self.running.remove(req)
        used = slice_runs(req.runs, req.access_start, req.n_blocks)
        self.tier.access(used, now, session=sid, inserted=req.inserted)
        self.gpu.release(req.runs, req.extra_blocks)
        if self.lower is not None:
            self.lower.on_complete(session, req.turn, now)
        if self.hint_source == "predicted" and not turn.last:
            gap = self.gaps.predict(turn.stop)
            self.tier.hint(sid, SessionHint(expected_gap_s=gap), now)
        self.arm_timer(now)
        res = self.result
        res.turn_root.append(self.root_of[session])
        res.turn_session.append(session)
        res.turn_index.append(req.turn)
        res.ttft_s.append(req.first_token - req.arrival)
        res.jct_s.append(now - req.arrival)
        bt = self.bt
        res.host_hit_tokens.append(req.host_hit * bt)
        res.reusable_tokens.append(max(0, turn.seen_blocks - req.gpu_hit) * bt)
        res.prefill_tokens.append(req.prefilled)
        res.gpu_hit_tokens.append(req.gpu_hit * bt)
        res.last_completion_s = max(res.last_completion_s, now)
        self.prev_done[session] = now
        self.prev_stop[session] = turn.stop
        self.done_turns += 1
        if self.progress is not None and self.done_turns % 1000 == 0:
            self.progress(1000)
        for child in self.children.get((session, req.turn), ()):
            self.push(now + self.trace.sessions[child].turns[0].gap_s, _ARRIVAL, (child, 0))
        if turn.last:
            self._set_live(now, session, None)
            if sess.join is not None and sess.parent is not None:
                self._join_done(sess.parent, sess.join[0], now + sess.join[1])
            return
        nxt = req.turn + 1
        wait = self.join_wait.get((session, nxt))
        own = now + sess.turns[nxt].gap_s
        if wait is None:
            self.push(own, _ARRIVAL, (session, nxt))
        else:
            wait.ready = max(wait.ready, own)
            wait.own_done = True
            self._maybe_release(session, nxt, wait)

    def _join_done(self, parent: int, turn: int, ready: float) -> None:
        wait = self.join_wait[(parent, turn)]
        wait.ready = max(wait.ready, ready)
        wait.children -= 1
        self._maybe_release(parent, turn, wait)

    def _maybe_release(self, session: int, turn: int, wait: _Join) -> None:
        # The turn arrives once its own gap has begun and every joined child is done.
        if wait.own_done and wait.children == 0:
            self.push(wait.ready, _ARRIVAL, (session, turn))

    def _drop_dead(self, session: int, prev: Sequence[Run], new: Sequence[Run]) -> None:
        kept = {seg: stop for seg, _start, stop in new}
        owner = self.trace.segment_owner
        dead = [
            Run(seg, kept.get(seg, 0), stop)
            for seg, _start, stop in prev
            if owner[seg] == session and kept.get(seg, 0) < stop
        ]
        if dead:
            self.tier.drop(dead)

    # --- live working set -------------------------------------------------------------------

    def _set_live(self, now: float, session: int, blocks: int | None) -> None:
        old = self.live_blocks.pop(session, 0)
        self.live_total -= old
        if blocks is not None:
            self.live_blocks[session] = blocks
            self.live_total += blocks
        self.ws_samples.append((now, self.live_total, len(self.live_blocks)))

    def finish(self) -> RunResult:
        res = self.result
        counters: Counter[str] = Counter()
        counters.update(self.tier.counters)
        for key, value in self.tier.policy.counters.items():
            counters[f"policy_{key}"] += value
        counters["gpu_evicted_blocks"] = self.gpu.evicted_blocks
        res.counters = dict(sorted(counters.items()))
        blocks_p95, live_p95 = _time_weighted_p95(self.ws_samples)
        res.p95_live_working_set_gib = blocks_p95 * self.block_bytes / GIB
        res.p95_live_sessions = live_p95
        if res.first_arrival_s == math.inf:
            res.first_arrival_s = 0.0
        if self.lower is not None:
            res.tiering = self.lower.report()
        return res

    def run(self) -> RunResult:
        self.schedule_roots()
        heap = self.heap
        while heap:
            now, kind, _seq, payload = heapq.heappop(heap)
            if kind == _STEP:
                self.on_step(now, cast(int, payload))
            elif kind == _ARRIVAL:
                session, k = cast(tuple[int, int], payload)
                self.on_arrival(now, session, k)
            elif kind == _LOAD:
                self.on_load(now, cast(_Request, payload))
            else:
                if self.timer_at is not None and now >= self.timer_at:
                    self.timer_at = None
                self.tier.expire(now)
                self.arm_timer(now)
        if self.waiting or self.running or self.loading:
            raise AssertionError("replay ended with requests still queued")
        expected = sum(
            len(s.turns)
            for i, s in enumerate(self.trace.sessions)
            if self.root_of[i] not in self.skipped
        )
        if self.done_turns != expected:
            raise AssertionError(f"replayed {self.done_turns} turns of {expected}")
        return self.finish()


def _time_weighted_p95(samples: Sequence[tuple[float, int, int]]) -> tuple[float, float]:
    """95th percentiles over time of a step function given as ``(time, value_a, value_b)``."""
    if len(samples) < 2:
        return (float(samples[0][1]), float(samples[0][2])) if samples else (0.0, 0.0)
    out: list[float] = []
    for col in (1, 2):
        spans: list[tuple[int, float]] = []
        for (t0, *vals), (t1, *_rest) in itertools.pairwise(samples):
            if t1 > t0:
                spans.append((vals[col - 1], t1 - t0))
        if not spans:
            out.append(float(samples[-1][col]))
            continue
        spans.sort()
        total = sum(d for _v, d in spans)
        acc = 0.0
        value = float(spans[-1][0])
        for v, d in spans:
            acc += d
            if acc >= 0.95 * total:
                value = float(v)
                break
        out.append(value)
    return out[0], out[1]


def simulate(
    trace: Trace, config: ReplayConfig, progress: Callable[[int], None] | None = None
) -> RunResult:
    """Replay ``trace`` through the engine model under ``config`` (deterministic per seed)."""
    if config.arrival_rate <= 0:
        raise ValueError("arrival_rate must be positive")
    if config.host_gib < 0:
        raise ValueError("host_gib must be >= 0")
    return _Sim(trace, config, progress).run()
