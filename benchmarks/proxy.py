"""``tenure bench proxy``: the proxy's added latency and throughput, direct vs proxied.

One run starts a real ``redis-server``, a canned upstream (raw asyncio, so the upstream costs
almost nothing) and the sidecar (``tenure serve``: one uvicorn worker, hints and Redis on), then
drives the same chat requests over ``--concurrency`` keep-alive connections, first straight at
the upstream, then through the proxy, in two phases each:

* throughput (``*_rps``): closed loop, every connection sends as soon as it has its answer;
* latency (``*_p50_ms`` / ``*_p99_ms``): open loop at ``--rate`` requests/s spread over the
  connections, latency counted from each request's scheduled send time. At saturation a closed
  loop's latency is just concurrency / throughput (queueing), which says nothing about the
  time the proxy adds to a request; at a fixed offered load it does.

Added latency is proxied minus direct, per percentile. The latency phase runs in ``--rounds``
alternating direct/proxied rounds so both sides see the same background load. ``--pin`` gives
the sidecar and its Redis a CPU (the last one) and the load generator and upstream the others,
as in a deployment where the sidecar and its local state store have their own core (a Redis
round trip is then a local hand-off, not a wake-up of another vCPU). ``--keep-cpus-awake``
measures without the VM's vCPU wake-up cost (see :func:`tenure.benchmarks.cpus.awake_cpus`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tenure.benchmarks.cpus import awake_cpus
from tenure.benchmarks.cpus import placement as cpu_placement
from tenure.benchmarks.proxy_measure import ROUTES, measure
from tenure.benchmarks.proxy_plot import plot_latency
from tenure.service.processes import (
    ManagedProcess,
    StackError,
    free_port,
    listening,
    redis_argv,
    redis_executable,
)

__all__ = ["configure"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=int, default=32, help="connections (default 32)")
    parser.add_argument(
        "--requests", type=int, default=4000, help="requests per phase (default 4000)"
    )
    parser.add_argument(
        "--rate", type=float, default=300.0,
        help="offered load of the latency phase, requests/s (default 300)",
    )  # fmt: skip
    parser.add_argument(
        "--rounds", type=int, default=5,
        help="alternating direct/proxied latency rounds (default 5)",
    )  # fmt: skip
    parser.add_argument(
        "--pin", action="store_true",
        help="give the sidecar and its Redis the last CPU, the load generator and upstream "
        "the others (default: the kernel places them)",
    )  # fmt: skip
    parser.add_argument(
        "--keep-cpus-awake", action="store_true",
        help="run a lowest-priority spinner per CPU so no vCPU halts between packets "
        "(separates a VM's wake-up latency from the proxy's)",
    )  # fmt: skip
    parser.add_argument(
        "--versus", action="append", metavar="TENURE_NAME=VALUE",
        help="also run a second sidecar with this setting changed (repeatable), interleaved "
        "round by round with the first: an A/B in one run (e.g. TENURE_UPSTREAM_CLIENT=aiohttp)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument(
        "--plot", type=Path,
        help="draw latency by percentile (direct, proxied, and the --versus sidecar) to this PNG",
    )  # fmt: skip
    parser.add_argument(
        "--no-hints", action="store_true", help="plain pass-through (no session header)"
    )
    parser.add_argument(
        "--route", choices=sorted(ROUTES), default="chat",
        help="the route measured: chat (/v1/chat/completions, default) or messages "
        "(/v1/messages, Anthropic); messages is reported with the chat figures of the same run",
    )  # fmt: skip
    parser.set_defaults(func=run)


@contextmanager
def _process(
    argv: list[str],
    port: int,
    what: str,
    logs: Path,
    env: dict[str, str] | None = None,
    cpus: set[int] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``argv`` (its output in ``logs``), wait for ``port``, stop it (and its group)."""
    from tenure.service.errors import UsageError

    managed = ManagedProcess(what, argv, logs / f"{what}-{port}.log", env or {}).start()
    assert managed.process is not None
    try:
        if cpus is not None:
            # Right after the fork, before the interpreter starts any thread (they inherit it).
            os.sched_setaffinity(managed.process.pid, cpus)
        try:
            managed.wait_until(lambda: listening(port), timeout=30)
        except StackError:
            # The log goes with the run's temporary directory: say its last lines now.
            raise UsageError(
                f"{what} did not start listening on port {port}: {managed.log_tail()}"
            ) from None
        yield managed.process
    finally:
        managed.stop(timeout=10)


def _versus_env(pairs: list[str]) -> dict[str, str]:
    from tenure.service.errors import UsageError

    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.startswith("TENURE_"):
            raise UsageError(f"--versus takes TENURE_NAME=VALUE, got {pair!r}")
        env[name] = value
    return env


def _own_keyspace(env: dict[str, str]) -> dict[str, str]:
    """The second sidecar keeps its state under its own prefix: the two replay the same
    session ids, and as replicas of one deployment they would serve each other's sessions
    (which is not what an A/B of one setting compares)."""
    return {"TENURE_REDIS_PREFIX": "tenure-versus", **env}


def _side(side: dict[str, Any], direct: dict[str, Any]) -> dict[str, Any]:
    return {
        "proxy_p50_ms": round(side["proxy_p50_ms"], 3),
        "proxy_p99_ms": round(side["proxy_p99_ms"], 3),
        "added_p50_ms": round(side["proxy_p50_ms"] - direct["direct_p50_ms"], 3),
        "added_p99_ms": round(side["proxy_p99_ms"] - direct["direct_p99_ms"], 3),
        "proxy_rps": round(side["proxy_rps"], 1),
        # CPU the sidecar process spent per proxied request in the throughput phase.
        "proxy_cpu_ms_per_request": round(side["cpu_ms_per_request"], 3),
        # The sidecar's own time per request (its histogram, upstream excluded, Redis
        # included) in the latency rounds.
        "in_sidecar_p50_ms": round(side["in_sidecar_p50_ms"], 3),
        "in_sidecar_p99_ms": round(side["in_sidecar_p99_ms"], 3),
    }


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from tenure.service.errors import UsageError

    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        # Before the run, not after minutes of it.
        raise UsageError("--plot needs matplotlib: pip install 'tenure[replay]'")

    if args.concurrency < 1 or args.requests < args.concurrency:
        raise UsageError("--concurrency must be >= 1 and --requests >= --concurrency")
    if not args.rate > 0:
        raise UsageError("--rate must be > 0")
    if args.rounds < 1:
        raise UsageError("--rounds must be >= 1")
    versus = _versus_env(args.versus) if args.versus else None
    redis_bin = redis_executable()
    if redis_bin is None:
        raise UsageError("redis-server is not installed (apt-get install redis-server)")
    redis_port, upstream_port = free_port(), free_port()
    ports = [free_port() for _ in range(2 if versus else 1)]
    hints = not args.no_hints
    with tempfile.TemporaryDirectory(prefix="tenure-bench-") as tmp:
        redis = redis_argv(redis_bin, redis_port, Path(tmp))

        def env(port: int, extra: dict[str, str]) -> dict[str, str]:
            return {
                **os.environ,
                "TENURE_HOST": "127.0.0.1",
                "TENURE_PORT": str(port),
                "TENURE_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
                "TENURE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "TENURE_DEV_MODE": "1",
                "TENURE_PUSH_ADDR": f"tcp://127.0.0.1:{free_port()}",
                **extra,
            }

        upstream_argv = [sys.executable, "-m", "tenure.benchmarks.proxy_load", "--port"]
        sidecar_argv = [
            sys.executable,
            "-m",
            "tenure.service.cli",
            "serve",
            "--log-level",
            "warning",
        ]
        placement = cpu_placement(args.pin)
        side_cpus, rest_cpus = placement if placement is not None else (None, None)
        saved_affinity = os.sched_getaffinity(0) if placement is not None else None
        with contextlib.ExitStack() as stack:
            stack.enter_context(awake_cpus(args.keep_cpus_awake))
            # Redis shares the sidecar's CPU: it is the sidecar's local state store, while the
            # load generator and the upstream stand in for remote clients and the engine.
            logs = Path(tmp)
            stack.enter_context(_process(redis, redis_port, "redis-server", logs, cpus=side_cpus))
            upstream = [*upstream_argv, str(upstream_port)]
            stack.enter_context(_process(upstream, upstream_port, "upstream", logs, cpus=rest_cpus))
            sidecars = [
                (
                    port,
                    stack.enter_context(
                        _process(sidecar_argv, port, "sidecar", logs, env(port, extra), side_cpus)
                    ).pid,
                )
                for port, extra in zip(ports, [{}, _own_keyspace(versus or {})], strict=False)
            ]
            where = (
                f"sidecar and Redis pinned to CPU {sorted(side_cpus)}, load generator and "
                f"upstream to {sorted(rest_cpus)}"
                if side_cpus is not None and rest_cpus is not None
                else "no CPU pinning"
            )
            if args.keep_cpus_awake:
                where += ", idle CPUs kept awake"
            if versus:
                where += f"; versus a second sidecar with {versus}, interleaved"
            print(
                f"tenure bench proxy ({args.route}): concurrency {args.concurrency}, "
                f"{args.requests} requests "
                f"per phase, latency at {args.rate:g} req/s in {args.rounds} alternating rounds, "
                f"hints {'on' if hints else 'off'}, Redis on, {where}",
                flush=True,
            )
            try:
                if rest_cpus is not None:
                    os.sched_setaffinity(0, rest_cpus)
                # --route messages: chat first, then messages, on the same processes, so the
                # two routes' figures compare like for like on a machine whose load drifts.
                measured = {
                    route: asyncio.run(measure(upstream_port, sidecars, args, hints, route))
                    for route in dict.fromkeys(["chat", args.route])
                }
                m = measured[args.route]
            finally:
                if saved_affinity is not None:
                    os.sched_setaffinity(0, saved_affinity)
    main = _side(m["sides"][0], m)
    result: dict[str, Any] = {
        "concurrency": args.concurrency,
        "direct_p50_ms": round(m["direct_p50_ms"], 3),
        "direct_p99_ms": round(m["direct_p99_ms"], 3),
        "proxy_p50_ms": main["proxy_p50_ms"],
        "proxy_p99_ms": main["proxy_p99_ms"],
        "added_p50_ms": main["added_p50_ms"],
        "added_p99_ms": main["added_p99_ms"],
        "direct_rps": round(m["direct_rps"], 1),
        "proxy_rps": main["proxy_rps"],
        "latency_offered_rps": args.rate,
        "rounds": args.rounds,
        "added_p50_ms_by_round": m["added_p50_ms_by_round"],
        "pinned": placement is not None,
        "cpus_kept_awake": bool(args.keep_cpus_awake),
        "proxy_cpu_ms_per_request": main["proxy_cpu_ms_per_request"],
        "in_sidecar_p50_ms": main["in_sidecar_p50_ms"],
        "in_sidecar_p99_ms": main["in_sidecar_p99_ms"],
    }
    if versus:
        result["versus"] = {"env": versus, **_side(m["sides"][1], m)}
    if args.route != "chat":
        chat = measured["chat"]
        result["route"] = args.route
        result["chat"] = {
            "direct_p50_ms": round(chat["direct_p50_ms"], 3),
            "direct_p99_ms": round(chat["direct_p99_ms"], 3),
            "direct_rps": round(chat["direct_rps"], 1),
            **_side(chat["sides"][0], chat),
        }
    for key, value in result.items():
        print(f"  {key:15s} {value}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot is not None:
        plot_latency(m["latencies"], result, args.plot)
        print(f"wrote {args.plot}")
    return 0
