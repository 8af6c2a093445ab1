"""One arm of the A/B: a fresh stack (Redis, sidecar, engine) under one host-tier policy.

The slice is played through the arm's proxy by the :class:`~tenure.service.live.driver.Driver`; the
engine's and the sidecar's ``/metrics`` are scraped every few seconds (the time series of the
plot and the progress line) and once at the end (the table). Every figure of an arm comes from
its own fresh engine, so counters start at zero.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tenure.service.live.dispatch import DispatchPlan, Gate
from tenure.service.live.driver import Driver, TurnRecord
from tenure.service.live.stack import ABStack, ABStackConfig
from tenure.service.live.workload import Workload
from tenure.service.replay.model import Trace

__all__ = [
    "ArmPlay",
    "ArmResult",
    "ArmSample",
    "prepare_stack",
    "run_arm",
    "run_arms_side_by_side",
    "sum_metric",
]

Say = Callable[[str], None]

_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
_BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def sum_metric(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """A metric summed over its label sets, keeping those matching ``labels``."""
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for key, value in samples.items():
        if key != name and not key.startswith(name + "{"):
            continue
        if all(w in key for w in want):
            total += value
    return total


@dataclass(slots=True)
class ArmSample:
    """Cumulative counters at one moment of the run (seconds since its start)."""

    t: float
    turns: int
    seen_tokens: int
    computed: float
    local_hit: float
    host_hit: float

    @property
    def host_hit_rate(self) -> float:
        could = self.seen_tokens - self.local_hit
        return self.host_hit / could if could > 0 else 0.0


@dataclass
class ArmResult:
    policy: str
    records: list[TurnRecord]
    engine: dict[str, float]
    sidecar: dict[str, float]
    series: list[ArmSample] = field(default_factory=list)
    wall_s: float = 0.0
    logs: Path | None = None
    proxy_url: str = ""
    engine_url: str = ""
    #: Share of a core the stacks still waiting for their arm used while this one ran
    #: (``--quick`` starts every arm's stack at once; ``None``: none were waiting).
    waiting_cpu_share: float | None = None
    #: Seconds the dispatch plan held calls beyond their own due time (summed over calls),
    #: and calls it let go only at its patience limit (``None``: no plan, calls ran free).
    gate_held_s: float | None = None
    gate_forced: int | None = None


def prepare_stack(config: ABStackConfig, say: Say) -> ABStack:
    """Start the arm's stack (the caller stops it)."""
    stack = ABStack(config, progress=lambda line: say(f"[{config.policy}] {line}"))
    stack.start()
    return stack


def run_arm(
    stack: ABStack,
    work: Workload,
    engine: Trace,
    schedule: list[tuple[float, int]],
    say: Say,
    *,
    plan: DispatchPlan | None = None,
    tick_s: float = 5.0,
    sample_s: float = 2.0,
) -> ArmResult:
    """Play the slice through ``stack``'s proxy; the figures the report needs."""
    play = ArmPlay(stack, work, engine, say, Driver(work, stack.proxy_url, schedule, plan=plan))
    asyncio.run(play.play(tick_s, sample_s))
    return play.result()


def run_arms_side_by_side(
    stacks: list[ABStack],
    work: Workload,
    engine: Trace,
    schedule: list[tuple[float, int]],
    say: Say,
    *,
    plan: DispatchPlan,
    tick_s: float = 5.0,
    sample_s: float = 2.0,
) -> list[ArmResult]:
    """Play the slice through every stack at once, each call sent to every arm together
    (one :class:`Gate` for all arms): the figures of each arm, as :func:`run_arm`'s."""
    gate = Gate(plan, arms=len(stacks))
    plays = [
        ArmPlay(s, work, engine, say, Driver(work, s.proxy_url, schedule, gate=gate))
        for s in stacks
    ]

    async def everything() -> None:
        await asyncio.gather(*(p.play(tick_s, sample_s) for p in plays))

    asyncio.run(everything())
    return [p.result() for p in plays]


class ArmPlay:
    """One arm's play of the slice: its driver, the engine counters sampled as it goes (the
    plot's series and the progress line), and the figures once it is over."""

    def __init__(
        self, stack: ABStack, work: Workload, engine: Trace, say: Say, driver: Driver
    ) -> None:
        self.stack = stack
        self.work = work
        self.say = say
        self.driver = driver
        self.policy = stack.config.policy
        tokens = engine.block_tokens
        self.seen = [[t.seen_blocks * tokens for t in s.turns] for s in engine.sessions]
        self.series: list[ArmSample] = []
        #: Seconds the play took (set when it is over).
        self.wall_s = 0.0
        self._last_say = 0.0

    def sample(self) -> ArmSample | None:
        try:
            metrics = self.stack.engine_metrics()
        except (urllib.error.URLError, OSError, ValueError):
            return None
        # Every call sent, in flight included: the engine counts a call's cached tokens when
        # it schedules it, before its answer is in.
        sent = list(self.driver.sent)
        point = ArmSample(
            self.driver.now(),
            len(self.driver.records),
            sum(self.seen[s][k] for s, k in sent),
            *(
                sum_metric(metrics, "vllm:prompt_tokens_by_source_total", source=s)
                for s in _SOURCES
            ),
        )
        self.series.append(point)
        return point

    def _tick(self, tick_s: float) -> None:
        point = self.sample()
        if point is None or point.t - self._last_say < tick_s - 1e-6:
            return
        self._last_say = point.t
        state = self.driver.state
        self.say(
            f"[{self.policy}] {point.t:5.0f} s: sessions {len(state.started_sessions)}/"
            f"{len(self.work.sessions)} started, {len(state.finished_sessions)} finished; turns "
            f"{state.turns_done}/{self.work.turns}; host-tier hit rate {point.host_hit_rate:.1%}"
            + (f"; {state.errors} failed" if state.errors else "")
        )

    async def play(self, tick_s: float, sample_s: float) -> None:
        self.say(f"[{self.policy}] playing {self.work.describe()} through {self.stack.proxy_url}")
        started = time.perf_counter()
        await self.driver.run(lambda: self._tick(tick_s), sample_s)
        self.wall_s = time.perf_counter() - started

    def result(self) -> ArmResult:
        """The arm's figures, once its play is over."""
        stack, driver, policy, wall = self.stack, self.driver, self.policy, self.wall_s
        if stack.uses_adapter:
            # The adapter reports its counters over the push channel every report interval.
            time.sleep(2 * stack.config.report_interval_s + 0.5)
        final = self.sample()
        sidecar = stack.sidecar_metrics()
        engine_metrics = stack.engine_metrics()
        if final is not None:
            self.say(
                f"[{policy}] done in {wall:.0f} s: {len(driver.records)} turns, host-tier hit "
                f"rate {final.host_hit_rate:.1%}, {final.computed:.0f} prompt tokens computed"
            )
        gate = driver.gate
        return ArmResult(
            policy,
            sorted(driver.records, key=lambda r: (r.session, r.turn)),
            engine_metrics,
            sidecar,
            self.series,
            wall,
            stack.logs,
            stack.proxy_url,
            stack.engine_url,
            gate_held_s=gate.held_s if gate is not None else None,
            gate_forced=gate.forced if gate is not None else None,
        )
