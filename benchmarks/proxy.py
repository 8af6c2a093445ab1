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
measures without the VM's vCPU wake-up cost (see :func:`benchmarks.cpus.awake_cpus`).
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

from benchmarks.cpus import awake_cpus, cpu_seconds
from benchmarks.cpus import placement as cpu_placement
from benchmarks.proxy_load import run_load
from benchmarks.proxy_plot import plot_latency
from benchmarks.stats import bucket_quantile, percentile
from service.processes import (
    ManagedProcess,
    StackError,
    free_port,
    listening,
    redis_argv,
    redis_executable,
)

__all__ = ["ROUTES", "configure"]

#: ``--route`` name -> upstream path.
ROUTES = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


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
    from service.errors import UsageError

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


def _requests(
    concurrency: int, total: int, hints: bool, path: str = "/v1/chat/completions"
) -> list[list[bytes]]:
    per_connection: list[list[bytes]] = []
    each = max(1, total // concurrency)
    for conn in range(concurrency):
        task = {"role": "user", "content": f"task {conn}: run the tests"}
        if path == ROUTES["messages"]:
            # The same conversation as Anthropic Messages (system prompt at the top level).
            request_body: dict[str, Any] = {
                "model": "bench", "system": "You are a coding agent.", "messages": [task],
                "max_tokens": 16,
            }  # fmt: skip
        else:
            system = {"role": "system", "content": "You are a coding agent."}
            request_body = {"model": "bench", "messages": [system, task], "max_tokens": 16}
        body = json.dumps(request_body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
        )
        if hints:
            head += f"x-tenure-session: bench-{conn}\r\nx-tenure-segment: main\r\n"
        request = head.encode() + b"\r\n" + body
        per_connection.append([request] * each)
    return per_connection


async def _warm(port: int, concurrency: int, hints: bool, path: str) -> None:
    await run_load(port, _requests(concurrency, 50 * concurrency // 4, hints, path))


async def _latencies(
    port: int, concurrency: int, total: int, hints: bool, rate: float, path: str
) -> list[float]:
    latencies, _elapsed, errors = await run_load(
        port, _requests(concurrency, total, hints, path), rate_per_s=rate
    )
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return latencies


async def _throughput(
    port: int, concurrency: int, total: int, hints: bool, path: str, pid: int | None = None
) -> tuple[float, float]:
    """Closed loop: requests/s, and the sidecar's CPU ms per request when ``pid`` is given."""
    cpu_before = cpu_seconds(pid) if pid is not None else float("nan")
    done, elapsed, errors = await run_load(port, _requests(concurrency, total, hints, path))
    cpu = (cpu_seconds(pid) - cpu_before) if pid is not None else float("nan")
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return len(done) / elapsed, cpu / len(done) * 1000


async def _measure(
    direct_port: int,
    sidecars: list[tuple[int, int]],
    args: argparse.Namespace,
    hints: bool,
    route: str = "chat",
) -> dict[str, Any]:
    """Latency in ``--rounds`` rounds, each direct then every sidecar (their order alternating
    round to round), so all sides see the same background load, which drifts on a shared VM;
    then throughput of each side. ``sidecars``: (port, pid), the measured one first."""
    c, rate, rounds = args.concurrency, args.rate, args.rounds
    per_round = max(c, args.requests // rounds)
    path = ROUTES[route]
    await _warm(direct_port, c, hints, path)
    for port, _pid in sidecars:
        await _warm(port, c, hints, path)
    buckets_before = [_sidecar_buckets(port, route) for port, _pid in sidecars]
    direct: list[float] = []
    proxied: list[list[float]] = [[] for _ in sidecars]
    added_by_round: list[float] = []
    for index in range(rounds):
        d = await _latencies(direct_port, c, per_round, hints, rate, path)
        direct += d
        order = list(range(len(sidecars)))
        if index % 2:
            order.reverse()
        for i in order:
            p = await _latencies(sidecars[i][0], c, per_round, hints, rate, path)
            proxied[i] += p
            if i == 0:
                added = (percentile(p, 0.5) - percentile(d, 0.5)) * 1000
                added_by_round.append(round(added, 3))
        print(
            f"  {route} latency round {index + 1}/{rounds}: added p50 {added_by_round[-1]:.3f} ms",
            flush=True,
        )
    direct_rps, _ = await _throughput(direct_port, c, args.requests, hints, path)
    sides: list[dict[str, Any]] = []
    for (port, pid), latencies, before in zip(sidecars, proxied, buckets_before, strict=True):
        buckets = _sidecar_buckets(port, route)
        in_sidecar = {le: count - before.get(le, 0.0) for le, count in buckets.items()}
        rps, cpu_ms = await _throughput(port, c, args.requests, hints, path, pid)
        sides.append(
            {
                "proxy_p50_ms": percentile(latencies, 0.50) * 1000,
                "proxy_p99_ms": percentile(latencies, 0.99) * 1000,
                "proxy_rps": rps,
                "cpu_ms_per_request": cpu_ms,
                "in_sidecar_p50_ms": bucket_quantile(in_sidecar, 0.50) * 1000,
                "in_sidecar_p99_ms": bucket_quantile(in_sidecar, 0.99) * 1000,
            }
        )
    return {
        "direct_p50_ms": percentile(direct, 0.50) * 1000,
        "direct_p99_ms": percentile(direct, 0.99) * 1000,
        "direct_rps": direct_rps,
        "added_p50_ms_by_round": added_by_round,
        "sides": sides,
        "latencies": {"direct": direct, "proxied": proxied},
    }


def _sidecar_buckets(port: int, route: str = "chat") -> dict[float, float]:
    """Cumulative buckets of the sidecar's own time per request of ``route``, from its
    ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    prefix = 'tenure_sidecar_latency_seconds_bucket{le="'
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix) and f'route="{route}"' in line:
            le = line[len(prefix) :].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def _versus_env(pairs: list[str]) -> dict[str, str]:
    from service.errors import UsageError

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

    from service.errors import UsageError

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

        upstream_argv = [sys.executable, "-m", "benchmarks.proxy_load", "--port"]
        sidecar_argv = [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"]
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
                    route: asyncio.run(_measure(upstream_port, sidecars, args, hints, route))
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
