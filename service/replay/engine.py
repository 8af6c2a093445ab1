"""A deterministic discrete-event model of one vLLM engine with a policy-governed host tier.

``simulate(trace, config) -> RunResult``. Events are ordered by ``(time, kind, sequence)``; the
only randomness (Poisson session arrivals and the order sessions arrive in) comes from one
``random.Random(seed)``, so paired runs of different policies share arrivals and gaps.

Engine: continuous batching with chunked prefill (decodes first, then prefill chunks in
admission order up to ``max_num_batched_tokens``). Time advances span to span: a span is a run
of identical engine steps (same batch, same chunk sizes) whose length is the number of steps
until the batch must change (a prefill finishes, a decode finishes, or a request arrives or
finishes loading, which truncates the span at the next step boundary). Step time is the
hardware roofline (:mod:`tenure.service.replay.hardware`) at the span's mean positions.

GPU pool: :class:`~tenure.service.replay.gpu_pool.GpuPrefixCache`. Host tier:
:class:`~tenure.service.policy.tier.HostTier` governed by the policy under test, with loads on the
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
:class:`~tenure.service.policy.gap.GapPredictor` trained online on the gaps observed so far in this
run, refined at completion with the response's own stop reason (a policy that
``learns_gaps`` gets no gap for a turn without a stop reason: it learns one per session itself);
``exact`` — the true next gap
from the trace; ``none`` — no hints. ``last_turn`` is declared on a session's final request for
every hint-using policy. Hint-using policies also get the harness's view of a divergence: when
a session's new call no longer uses the tail of a segment its previous call used (a compaction,
a rewritten last block), that dead tail is dropped from the host tier at once
(``HostTier.drop``); hint-blind policies, like vLLM, leave it to age out.

Sessions whose largest call cannot fit the GPU KV pool are skipped whole (and counted): vLLM
would reject such a prompt.

With ``ReplayConfig.tiering`` an SSD tier sits below the host tier, governed by a placement
policy: :mod:`tenure.service.replay.tiering` creates the host tier and is called at the lookup,
load, store, arrival and completion hooks marked ``sim.lower`` (nothing changes without it).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import cast

from tenure.service.replay.batching import Batching
from tenure.service.replay.bound import Access, block_work, prefill_bound, saved_work
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import GIB
from tenure.service.replay.model import Trace
from tenure.service.replay.pacing import DispatchPlan, GateRule
from tenure.service.replay.requests import Request
from tenure.service.replay.results import RunResult, time_weighted_p95
from tenure.service.replay.sim_state import ARRIVAL, LOAD, STEP, SimState
from tenure.service.replay.workload import Workload

__all__ = ["simulate", "simulate_paced"]


class _Sim:
    """One run: the event loop over a workload and a batching model that share one state."""

    def __init__(
        self, trace: Trace, config: ReplayConfig, progress: Callable[[int], None] | None
    ) -> None:
        lower_tier = None
        if config.tiering is not None:
            from tenure.service.replay.tiering import LowerTier

            lower_tier = LowerTier
        self.sim = SimState(trace, config, progress, lower_tier)
        self.workload = Workload(self.sim)
        self.batching = Batching(self.sim)

    def finish(self) -> RunResult:
        sim = self.sim
        res = sim.result
        counters: Counter[str] = Counter()
        counters.update(sim.tier.counters)
        for key, value in sim.tier.policy.counters.items():
            counters[f"policy_{key}"] += value
        counters["gpu_evicted_blocks"] = sim.gpu.evicted_blocks
        res.counters = dict(sorted(counters.items()))
        blocks_p95, live_p95 = time_weighted_p95(self.workload.ws_samples)
        res.p95_live_working_set_gib = blocks_p95 * sim.block_bytes / GIB
        res.p95_live_sessions = live_p95
        if res.first_arrival_s == math.inf:
            res.first_arrival_s = 0.0
        if sim.lower is not None:
            res.tiering = sim.lower.report()
        if sim.accesses is not None:
            self._bound(res, sim.accesses)
        return res

    def _bound(self, res: RunResult, admitted: list[Request]) -> None:
        sim = self.sim
        log = [
            Access(r.runs, r.lookup_s, r.done_s, r.gpu_hit, r.host_hit, r.first_token)
            for r in admitted
        ]
        work = block_work(sim.hw, sim.bt)
        res.saved_work = saved_work(log, work)
        # An unbounded tier (``infinite``) is bounded by holding everything.
        capacity = None if sim.tier.policy.unbounded else res.host_capacity_blocks
        bound = prefill_bound(log, capacity, work)
        res.bound_work = bound.work
        res.bound_seconds = bound.seconds
        res.bound_intervals = bound.intervals
        res.bound_prefill_work = prefill_bound(log, capacity, work, prefill_stores=True).work
        if sim.config.bound_held:
            res.bound_held_work = prefill_bound(log, capacity, work, hold_across_gpu=True).work
            res.bound_vllm_work = prefill_bound(log, capacity, work, vllm_offers=True).work

    def start(self) -> None:
        self.workload.schedule_roots()

    def step(self, pace: _Pace | None = None) -> float:
        """Handle the next event of the clock (its time returned); with ``pace`` a call that
        becomes due waits for the dispatch plan (:class:`_Pace`) instead of arriving."""
        sim, workload, batching = self.sim, self.workload, self.batching
        now, kind, _seq, payload = heapq.heappop(sim.heap)
        if kind == STEP:
            finished = batching.on_step(now, cast(int, payload))
            if finished is not None:
                for req in finished:
                    workload.complete(req, now)
                    if pace is not None:
                        pace.rule.done((req.session, req.turn))
                batching.start_span(now)
        elif kind == ARRIVAL:
            session, k = cast(tuple[int, int], payload)
            if pace is None:
                self.arrive(now, session, k)
            else:
                pace.due(self, (session, k))
        elif kind == LOAD:
            batching.on_load(now, cast(Request, payload))
        else:
            if sim.timer_at is not None and now >= sim.timer_at:
                sim.timer_at = None
            sim.tier.expire(now)
            sim.arm_timer(now)
        return now

    def arrive(self, now: float, session: int, k: int) -> None:
        self.workload.on_arrival(now, session, k)
        self.batching.poke(now)

    def end(self) -> RunResult:
        sim, workload, batching = self.sim, self.workload, self.batching
        if sim.waiting or sim.running or batching.loading:
            raise AssertionError("replay ended with requests still queued")
        expected = sum(
            len(s.turns)
            for i, s in enumerate(sim.trace.sessions)
            if workload.root_of[i] not in workload.skipped
        )
        if workload.done_turns != expected:
            raise AssertionError(f"replayed {workload.done_turns} turns of {expected}")
        return self.finish()

    def run(self) -> RunResult:
        self.start()
        heap = self.sim.heap
        while heap:
            self.step()
        return self.end()


class _Pace:
    """The arms of :func:`simulate_paced` held to one dispatch plan: a call that becomes due
    in an arm waits there until the plan's :class:`~tenure.service.replay.pacing.GateRule`
    lets it go, then arrives in every arm at once (the live gate's rule on the simulated
    clock)."""

    def __init__(self, rule: GateRule, arms: list[_Sim]) -> None:
        self.rule = rule
        self.arms = arms
        self.held: list[set[tuple[int, int]]] = [set() for _ in arms]

    def due(self, arm: _Sim, key: tuple[int, int]) -> None:
        if not self.rule.knows(key):
            raise ValueError(f"call {key} is not in the dispatch plan")
        self.rule.arrive(key)
        self.held[self.arms.index(arm)].add(key)

    def release(self, now: float) -> None:
        rule = self.rule
        while (key := rule.head()) is not None and rule.ready(key):
            holders = [i for i, held in enumerate(self.held) if key in held]
            if not holders:  # pragma: no cover - ready() needs an arm holding the head
                raise AssertionError(f"the plan's next call {key} is held by no arm")
            for i in holders:
                self.held[i].discard(key)
                rule.leave(key)
                rule.passed(key)
                self.arms[i].arrive(now, *key)


def simulate(
    trace: Trace, config: ReplayConfig, progress: Callable[[int], None] | None = None
) -> RunResult:
    """Replay ``trace`` through the engine model under ``config`` (deterministic per seed)."""
    if config.arrival_rate <= 0:
        raise ValueError("arrival_rate must be positive")
    if config.host_gib < 0:
        raise ValueError("host_gib must be >= 0")
    return _Sim(trace, config, progress).run()


def simulate_paced(
    trace: Trace, configs: Sequence[ReplayConfig], plan: DispatchPlan
) -> list[RunResult]:
    """Replay ``trace`` once per config, every arm held to ``plan`` as ``tenure up``'s live
    arms are: a call goes out when the plan's :class:`~tenure.service.replay.pacing.GateRule`
    lets it (every call before it in the plan's order gone, the calls the plan had finished
    before it finished, and the call due, in every arm), in all arms at once. One config is
    a live arm played in turn under the plan; two are a side-by-side run, where the arm whose
    calls finish sooner waits for the other. The arms share one clock (events in time order
    across arms, a clock tie going to the first arm)."""
    for config in configs:
        if config.arrival_rate <= 0:
            raise ValueError("arrival_rate must be positive")
    arms = [_Sim(trace, config, None) for config in configs]
    pace = _Pace(GateRule(plan, len(arms)), arms)
    for arm in arms:
        arm.start()
    while True:
        nxt: tuple[float, int, int] | None = None
        for i, arm in enumerate(arms):
            heap = arm.sim.heap
            if heap and (nxt is None or (heap[0][0], heap[0][1], i) < nxt):
                nxt = (heap[0][0], heap[0][1], i)
        if nxt is None:
            break
        pace.release(arms[nxt[2]].step(pace))
    if any(pace.held):
        raise AssertionError("the dispatch plan still holds calls at the end of the replay")
    return [arm.end() for arm in arms]
