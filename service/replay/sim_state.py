"""The state one replay run shares between its parts, and the hooks of an SSD tier below it.

The simulator is one event loop over three jobs, each in its own module: the workload and
its session graph (:mod:`service.replay.workload`: arrivals, sub-agent spawns and joins,
closed-loop gaps, the live working set), the engine's batching model
(:mod:`service.replay.batching`: admission, loads, spans of identical steps, store offers),
and result recording (:mod:`service.replay.results`). They read and write the fields declared
here; :class:`~service.replay.engine` composes them and owns the event queue. The SSD tier
(:mod:`service.replay.tiering`) sees the run through this class too, so it never imports the
engine that drives it.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from service.policy import GapPredictor, HostTier
from service.policy.base import HintSource
from service.policy.types import Run
from service.replay.config import ReplayConfig
from service.replay.gpu_pool import GpuPrefixCache
from service.replay.hardware import HardwareProfile
from service.replay.model import Trace
from service.replay.requests import Join, Request
from service.replay.results import RunResult

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
    """Fields of one run (set by the engine's constructor) and the event queue's two calls."""

    trace: Trace
    config: ReplayConfig
    hw: HardwareProfile
    #: Tokens per block, and bytes per block of KV.
    bt: int
    block_bytes: int
    progress: Callable[[int], None] | None
    hint_source: HintSource
    drop_dead_tails: bool
    lower: LowerTierHooks | None
    tier: HostTier
    gpu: GpuPrefixCache
    gaps: GapPredictor
    result: RunResult
    heap: list[tuple[float, int, int, object]]
    seq: int
    waiting: deque[Request]
    running: list[Request]
    loading: int
    pcie_free_at: float
    timer_at: float | None
    span: Span | None
    span_gen: int
    # Per-session closed-loop bookkeeping.
    prev_done: list[float]
    prev_stop: list[str | None]
    join_wait: dict[tuple[int, int], Join]
    children: dict[tuple[int, int], list[int]]
    root_of: list[int]
    # Live working set: a step function sampled at every change.
    live_blocks: dict[int, int]
    live_total: int
    ws_samples: list[tuple[float, int, int]]
    done_turns: int
    skipped: set[int]
    #: Admitted requests in admission order, kept for the bound (``None``: not recorded).
    accesses: list[Request] | None

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

    # Each part calls into the other: the batching model completes requests, the workload
    # queues new ones. Declared here, defined by the part that owns it.
    def poke(self, now: float) -> None:
        raise NotImplementedError

    def complete(self, req: Request, now: float) -> None:
        raise NotImplementedError
