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

from tenure.service.live.dispatch import DispatchPlan
from tenure.service.live.driver import Driver, TurnRecord
from tenure.service.live.stack import ABStack, ABStackConfig
from tenure.service.live.workload import Workload
from tenure.service.replay.model import Trace

__all__ = ["ArmResult", "ArmSample", "prepare_stack", "run_arm", "sum_metric"]

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
    policy = stack.config.policy
    seen = [[t.seen_blocks * engine.block_tokens for t in s.turns] for s in engine.sessions]
    driver = Driver(work, stack.proxy_url, schedule, plan=plan)
    series: list[ArmSample] = []

    def sample() -> ArmSample | None:
        try:
            metrics = stack.engine_metrics()
        except (urllib.error.URLError, OSError, ValueError):
            return None
        # Every call sent, in flight included: the engine counts a call's cached tokens when
        # it schedules it, before its answer is in.
        sent = list(driver.sent)
        point = ArmSample(
            driver.now(),
            len(driver.records),
            sum(seen[s][k] for s, k in sent),
            *(
                sum_metric(metrics, "vllm:prompt_tokens_by_source_total", source=s)
                for s in _SOURCES
            ),
        )
        series.append(point)
        return point

    total_sessions = len(work.sessions)
    last_say = [0.0]

    def tick() -> None:
        point = sample()
        if point is None or point.t - last_say[0] < tick_s - 1e-6:
            return
        last_say[0] = point.t
        state = driver.state
        say(
            f"[{policy}] {point.t:5.0f} s: sessions {len(state.started_sessions)}/"
            f"{total_sessions} started, {len(state.finished_sessions)} finished; turns "
            f"{state.turns_done}/{work.turns}; host-tier hit rate {point.host_hit_rate:.1%}"
            + (f"; {state.errors} failed" if state.errors else "")
        )

    say(f"[{policy}] playing {work.describe()} through {stack.proxy_url}")
    started = time.perf_counter()
    asyncio.run(driver.run(tick, sample_s))
    wall = time.perf_counter() - started
    if stack.uses_adapter:
        # The adapter reports its counters over the push channel every report interval.
        time.sleep(2 * stack.config.report_interval_s + 0.5)
    final = sample()
    sidecar = stack.sidecar_metrics()
    engine_metrics = stack.engine_metrics()
    if final is not None:
        say(
            f"[{policy}] done in {wall:.0f} s: {len(driver.records)} turns, host-tier hit rate "
            f"{final.host_hit_rate:.1%}, {final.computed:.0f} prompt tokens computed"
        )
    gate = driver.gate
    return ArmResult(
        policy,
        sorted(driver.records, key=lambda r: (r.session, r.turn)),
        engine_metrics,
        sidecar,
        series,
        wall,
        stack.logs,
        stack.proxy_url,
        stack.engine_url,
        gate_held_s=gate.held_s if gate is not None else None,
        gate_forced=gate.forced if gate is not None else None,
    )
