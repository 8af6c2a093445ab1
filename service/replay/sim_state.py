"""The state one replay run shares between its parts, and the hooks of an SSD tier below it.

The simulator is one event loop over two collaborators, each in its own module: the workload
and its session graph (:class:`~tenure.service.replay.workload.Workload`: arrivals, sub-agent spawns
and joins, closed-loop gaps, the live working set) and the engine's batching model
(:class:`~tenure.service.replay.batching.Batching`: admission, loads, spans of identical steps,
store offers). Both are handed one :class:`SimState` (the host tier, the GPU pool, the queues, the
event queue, the result being recorded) and neither knows the other: the engine's loop
(:mod:`tenure.service.replay.engine`) composes them, passing a finished request from the batching
model to the workload and a new one back. The SSD tier (:mod:`tenure.service.replay.tiering`) sees
the run through this state too, so it never imports the engine that drives it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from tenure.service.policy import GapPredictor, HostTier, create_policy, policy_class
from tenure.service.policy.types import Run
from tenure.service.replay.config import ReplayConfig, TieringConfig
from tenure.service.replay.gpu_pool import GpuPrefixCache
from tenure.service.replay.hardware import GIB
from tenure.service.replay.model import Trace
from tenure.service.replay.requests import Request
from tenure.service.replay.results import RunResult

__all__ = ["ARRIVAL", "LOAD", "STEP", "TIMER", "LowerTierHooks", "SimState", "Span"]

# Event kinds, in processing order at equal times: finish steps before admitting newcomers.
TIMER, STEP, LOAD, ARRIVAL = 0, 1, 2, 3

#: The span in progress: (start, steps, step seconds, decodes, prefill chunks).
Span = tuple[float, int, float, list[Request], list[tuple[Request, int]]]


class LowerTierHooks(Protocol):
    """What the engine calls of an SSD tier below the host tier (``tiering.LowerTier``)."""

    def host_tier(self, policy: Any, capacity: int) -> HostTier: ...

    def on_arrival(self, session: int, turn: int, now: float) -> None: ...

    def on_complete(self, session: int, turn: int, now: float) -> None: ...

    def lookup(
        self, runs: Sequence[Run], gpu_hit: int, session: str, now: float
    ) -> tuple[int, int]: ...

    def load_done(self, now: float, dram_blocks: int, ssd_blocks: int) -> float: ...

    def filter_offer(self, runs: Sequence[Run]) -> list[Run]: ...

    def stored(self, pieces: Sequence[Run], session: str, now: float) -> None: ...

    def report(self) -> dict[str, Any]: ...


class SimState:
    """What one run's workload, batching model and SSD tier share, and the event queue."""

    def __init__(
        self,
        trace: Trace,
        config: ReplayConfig,
        progress: Callable[[int], None] | None,
        lower_tier: Callable[[SimState, TieringConfig], LowerTierHooks] | None = None,
    ) -> None:
        self.trace = trace
        self.config = config
        self.hw = config.hardware
        #: Tokens per block, and bytes per block of KV.
        self.bt = trace.block_tokens
        self.block_bytes = self.bt * self.hw.kv_bytes_per_token
        self.progress = progress
        cls = policy_class(config.policy)
        self.hint_source = cls.hint_source
        self.learns_gaps = cls.learns_gaps
        # A lifecycle-aware deployment sees a session's new request diverge from its previous
        # one (a compaction, a rewritten last block) and drops the dead tail at once; vLLM's
        # own policies leave it to age out.
        self.drop_dead_tails = cls.hint_source != "none"
        policy = create_policy(config.policy, self._engine_facts(cls.defaults, config))
        capacity = int(config.host_gib * GIB // self.block_bytes)
        self.lower: LowerTierHooks | None = None
        self.tier: HostTier
        if config.tiering is None:
            self.tier = HostTier(policy, capacity)
        else:
            if lower_tier is None:
                raise ValueError("a tiering config needs the SSD tier's constructor")
            self.lower = lower_tier(self, config.tiering)
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
        self.timer_at: float | None = None
        #: Requests queued for admission, and admitted ones past their loads.
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: When the host->GPU link is free again (loads queue FIFO on it).
        self.pcie_free_at = 0.0
        #: Live blocks by session (the workload keeps it; the SSD tier stages by it).
        self.live_blocks: dict[int, int] = {}
        #: Admitted requests in admission order, kept for the bound (``None``: not recorded).
        self.accesses: list[Request] | None = (
            [] if config.bound and config.tiering is None else None
        )

    def _engine_facts(
        self, defaults: Mapping[str, float], config: ReplayConfig
    ) -> dict[str, float]:
        """The policy's parameters, with the engine facts it declares filled from the hardware
        profile unless given: ``depth_scale_blocks`` (the context depth, in blocks, at which a
        block's attention work equals its dense work: ``params / (2 * layers * width)`` tokens,
        the ratio of the two terms of :func:`tenure.service.replay.bound.block_work`)."""
        params = dict(config.policy_params or {})
        facts = {
            "depth_scale_blocks": self.hw.params
            / (2.0 * self.hw.layers * self.hw.attention_width * self.bt),
        }
        for key, value in facts.items():
            if key in defaults and key not in params:
                params[key] = value
        return params

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
            self.push(nxt, TIMER, None)
