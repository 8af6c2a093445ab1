"""``tenure bench replay``: wall time and peak memory of one replay over a whole trace.

Each policy runs in its own forked child process (one core), which loads the trace and replays
it once; the child reports its wall times and its own peak RSS. Prints a table, optionally
writes JSON. The acceptance target: one policy, one seed over the whole Claude Code trace in at
most 60 s on one core and under 2 GiB.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import time
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError

__all__ = ["configure", "measure"]


def _child(
    conn: Any,
    trace_path: str,
    fmt: str | None,
    policy: str,
    rate: float,
    host: float,
    hardware: str,
    seed: int,
) -> None:
    from tenure.service.replay.config import ReplayConfig
    from tenure.service.replay.engine import simulate
    from tenure.service.replay.hardware import get_profile
    from tenure.service.replay.loaders import load_trace

    start = time.perf_counter()
    trace = load_trace(Path(trace_path), fmt)
    loaded = time.perf_counter()
    run = simulate(trace, ReplayConfig(policy, get_profile(hardware), host, rate, seed))
    done = time.perf_counter()
    conn.send(
        {
            "policy": policy,
            "load_s": loaded - start,
            "simulate_s": done - loaded,
            "total_s": done - start,
            "cpu_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime
            + resource.getrusage(resource.RUSAGE_SELF).ru_stime,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "turns": run.turns,
            "sessions": run.sessions_run,
        }
    )
    conn.close()


def measure(
    trace: Path, fmt: str | None, policy: str, rate: float, host: float, hardware: str, seed: int
) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=_child, args=(child, str(trace), fmt, policy, rate, host, hardware, seed)
    )
    proc.start()
    child.close()
    result: dict[str, Any] = parent.recv()
    proc.join()
    return result


def configure(parser: argparse.ArgumentParser) -> None:
    from tenure.service.replay.paths import claude_code_trace

    parser.add_argument(
        "--trace", type=Path, default=None, help=f"trace file (default: {claude_code_trace()})"
    )
    parser.add_argument("--format", default=None)
    parser.add_argument("--policies", default="lru,tenure")
    parser.add_argument("--arrival-rate", type=float, default=0.005)
    parser.add_argument("--host-gib", type=float, default=128.0)
    parser.add_argument("--hardware", default="h100-llama3-8b")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from tenure.service.errors import TraceError
    from tenure.service.policy import UnknownPolicyError, policy_class
    from tenure.service.replay.hardware import get_profile
    from tenure.service.replay.paths import claude_code_trace

    trace = args.trace or claude_code_trace()
    if not trace.is_file():
        raise TraceError(f"{trace}: no such trace file")
    get_profile(args.hardware)
    if args.arrival_rate <= 0 or args.host_gib < 0:
        raise UsageError("--arrival-rate must be positive and --host-gib non-negative")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for name in policies:
        try:
            policy_class(name)
        except UnknownPolicyError as exc:
            raise UsageError(str(exc)) from None
    rows = []
    print(
        f"trace={trace} rate={args.arrival_rate}/s host={args.host_gib} GiB "
        f"hardware={args.hardware} seed={args.seed} (one process per policy, one core)"
    )
    print(
        f"{'policy':<18} {'load s':>7} {'simulate s':>10} {'total s':>8} {'cpu s':>7} "
        f"{'peak RSS MiB':>12} "
        f"{'turns':>7} {'turns/s wall':>12}"
    )
    for name in policies:
        row = measure(
            trace, args.format, name, args.arrival_rate, args.host_gib, args.hardware, args.seed
        )
        rows.append(row)
        print(
            f"{name:<18} {row['load_s']:7.2f} {row['simulate_s']:10.2f} {row['total_s']:8.2f} "
            f"{row['cpu_s']:7.2f} {row['peak_rss_mib']:12.0f} {row['turns']:7d} "
            f"{row['turns'] / row['total_s']:12.0f}"
        )
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "config": vars(args) | {"trace": str(trace), "json": None, "func": None},
                    "results": rows,
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    return 0
