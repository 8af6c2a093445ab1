"""Experiments: the policy ladder and the operating-envelope sweep, runs in parallel processes.

Each (policy, seed, point) is one :func:`~tenure.service.replay.engine.simulate` call in a worker
process; the trace is loaded once in the parent and inherited by the workers (fork), never
pickled per task. Results are assembled into the JSON documented in the issue.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from typing import Any

from tenure.service.policy import policy_class, policy_names
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import GIB, HardwareProfile
from tenure.service.replay.metrics import samples, summarize
from tenure.service.replay.model import Trace
from tenure.service.replay.results import RunResult
from tenure.service.replay.stats import paired_delta

__all__ = [
    "LADDER_ORDER",
    "PAIRED_BASELINES",
    "LadderSpec",
    "build_ladder",
    "order_policies",
    "run_grid",
]

#: Display order: references and eviction-only baselines first, then the gate and its ablations.
LADDER_ORDER = (
    "notier",
    "lru",
    "arc",
    "ttl",
    "marconi",
    "mori",
    "lru-reclaim",
    "gate-only-literal",
    "tenure-tags-off",
    "tenure",
    "tenure-exact-gap",
    "oracle",
    "infinite",
)
PAIRED_BASELINES = ("lru", "notier")


def order_policies(names: Sequence[str]) -> list[str]:
    rank = {name: i for i, name in enumerate(LADDER_ORDER)}
    return sorted(dict.fromkeys(names), key=lambda n: (rank.get(n, len(rank)), n))


def all_policies() -> list[str]:
    return order_policies(policy_names())


@dataclass(frozen=True, slots=True)
class LadderSpec:
    policies: tuple[str, ...]
    hardware: HardwareProfile
    arrival_rate: float
    host_gib: float
    seeds: tuple[int, ...]
    boot: int
    paired_vs: tuple[str, ...] = PAIRED_BASELINES
    #: Compute every run's bound on saved prefill work (:mod:`tenure.service.replay.bound`).
    bound: bool = True
    #: How sessions' ends are known (:attr:`ReplayConfig.ends`).
    ends: str = "declared"


# The trace the workers replay, set in the parent just before the pool forks.
_WORKER_TRACE: list[Trace] = []
_WORKER_COUNTER: list[Any] = []


def _init_worker(counter: Any) -> None:
    _WORKER_COUNTER[:] = [counter]


def _report(n: int) -> None:
    counter = _WORKER_COUNTER[0] if _WORKER_COUNTER else None
    if counter is not None:
        with counter.get_lock():
            counter.value += n


def _run_one(config: ReplayConfig) -> RunResult:
    return simulate(_WORKER_TRACE[0], config, progress=_report)


def run_grid(
    trace: Trace,
    configs: Sequence[ReplayConfig],
    jobs: int,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[RunResult]:
    """Run every config (in parallel when ``jobs > 1``); results in the order given."""
    total = len(configs) * trace.turn_count
    if jobs <= 1 or len(configs) == 1:
        done = 0

        def tick(n: int) -> None:
            nonlocal done
            done += n
            if on_progress is not None:
                on_progress(min(done, total), total)

        return [simulate(trace, config, progress=tick) for config in configs]
    ctx = mp.get_context("fork")
    counter = ctx.Value("q", 0)
    _WORKER_TRACE[:] = [trace]
    try:
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(configs)),
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(counter,),
        ) as pool:
            futures: dict[Future[RunResult], int] = {
                pool.submit(_run_one, config): i for i, config in enumerate(configs)
            }
            results: list[RunResult | None] = [None] * len(configs)
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in finished:
                    results[futures[future]] = future.result()
                if on_progress is not None:
                    on_progress(min(counter.value, total), total)
    finally:
        _WORKER_TRACE.clear()
    return [r for r in results if r is not None]


def build_ladder(
    spec: LadderSpec, runs: Sequence[RunResult], config_extra: dict[str, Any]
) -> dict[str, Any]:
    """The ladder JSON: config, per-policy results, paired deltas vs ``lru`` and ``notier``."""
    by_policy: dict[str, list[RunResult]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    for group in by_policy.values():
        group.sort(key=lambda r: r.seed)
    results = {p: summarize(by_policy[p], spec.boot) for p in spec.policies}
    paired: dict[str, dict[str, list[float]]] = {}
    for base in spec.paired_vs:
        if base not in by_policy:
            continue
        control = samples(by_policy[base], "jct_s")
        paired[base] = {
            p: list(paired_delta(samples(by_policy[p], "jct_s"), control, 95, spec.boot))
            for p in spec.policies
        }
    first = runs[0]
    live = [r.p95_live_working_set_gib for r in runs]
    live_ws = sum(live) / len(live)
    config = {
        **config_extra,
        "policies": list(spec.policies),
        "hint_sources": {p: policy_class(p).hint_source for p in spec.policies},
        "arrival_rate": spec.arrival_rate,
        "host_gib": spec.host_gib,
        "ends": spec.ends,
        "hardware": spec.hardware.name,
        "seeds": list(spec.seeds),
        "boot": spec.boot,
        "bound": (
            "saved_over_bound: each run's prefill work saved by host hits over the LP bound on "
            "it for that run's own access sequence (service/replay/bound.py), at the run's "
            "host capacity (unbounded for infinite), every seed, summed over seeds"
            if spec.bound
            else "not computed"
        ),
        "sessions_run": first.sessions_run,
        "sessions_skipped_oversize": first.sessions_skipped_oversize,
        "host_capacity_blocks": first.host_capacity_blocks,
        "gpu_kv_pool_gib": spec.hardware.kv_pool_bytes() / GIB,
        "p95_live_working_set_gib": live_ws,
        "live_working_set_over_host": live_ws / spec.host_gib if spec.host_gib else None,
        "aggregation": "latency percentiles pool all seeds' turns; bytes, tokens, throughput "
        "and counters are per run averaged over seeds; p95_jct_ci is per-turn, "
        "p95_jct_ci_session is clustered by root session; paired deltas are [delta, lo, hi] "
        "in seconds of p95 JCT (policy minus baseline), session-clustered",
    }
    return {"config": config, "results": results, "paired_delta_p95_vs": paired}


def ladder_configs(spec: LadderSpec) -> list[ReplayConfig]:
    return [
        ReplayConfig(
            p,
            spec.hardware,
            spec.host_gib,
            spec.arrival_rate,
            seed,
            bound=spec.bound,
            ends=spec.ends,
        )
        for p in spec.policies
        for seed in spec.seeds
    ]


def sweep_specs(spec: LadderSpec, param: str, values: Sequence[float]) -> list[LadderSpec]:
    if param == "arrival-rate":
        return [replace(spec, arrival_rate=value) for value in values]
    if param == "host-gib":
        return [replace(spec, host_gib=value) for value in values]
    raise ValueError(f"cannot sweep {param!r}")


def default_jobs() -> int:
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)
