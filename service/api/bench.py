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

Added latency is proxied minus direct, per percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument(
        "--no-hints", action="store_true", help="plain pass-through (no session header)"
    )
    parser.set_defaults(func=run)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_port(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    from service.cli import UsageError

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise UsageError(f"{what} exited during start-up (code {process.returncode})")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise UsageError(f"{what} did not start listening on port {port}")


@contextmanager
def _process(
    argv: list[str], port: int, what: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _wait_port(port, process, what)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _requests(
    concurrency: int, total: int, hints: bool, path: str = "/v1/chat/completions"
) -> list[list[bytes]]:
    per_connection: list[list[bytes]] = []
    each = max(1, total // concurrency)
    for conn in range(concurrency):
        body = json.dumps(
            {
                "model": "bench",
                "messages": [
                    {"role": "system", "content": "You are a coding agent."},
                    {"role": "user", "content": f"task {conn}: run the tests"},
                ],
                "max_tokens": 16,
            }
        ).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n"
        )
        if hints:
            head += f"x-tenure-session: bench-{conn}\r\nx-tenure-segment: main\r\n"
        request = head.encode() + b"\r\n" + body
        per_connection.append([request] * each)
    return per_connection


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux ``/proc``); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _phase(
    port: int, concurrency: int, total: int, hints: bool, rate: float, pid: int | None = None
) -> dict[str, Any]:
    from service.api.bench_load import run_load

    await run_load(port, _requests(concurrency, min(total, 50 * concurrency) // 4, hints))
    buckets_before = _sidecar_buckets(port) if pid is not None else {}
    latencies, _elapsed, errors = await run_load(
        port, _requests(concurrency, total, hints), rate_per_s=rate
    )
    buckets = _sidecar_buckets(port) if pid is not None else {}
    in_sidecar = {le: count - buckets_before.get(le, 0.0) for le, count in buckets.items()}
    cpu_before = _cpu_seconds(pid) if pid is not None else float("nan")
    done, elapsed, more_errors = await run_load(port, _requests(concurrency, total, hints))
    cpu = (_cpu_seconds(pid) - cpu_before) if pid is not None else float("nan")
    errors += more_errors
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return {
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "rps": len(done) / elapsed,
        "cpu_ms_per_request": cpu / len(done) * 1000,
        "in_sidecar_p50_ms": _bucket_quantile(in_sidecar, 0.50) * 1000,
        "in_sidecar_p99_ms": _bucket_quantile(in_sidecar, 0.99) * 1000,
    }


def _sidecar_buckets(port: int) -> dict[float, float]:
    """Cumulative buckets of the sidecar's own time per chat request, from its ``/metrics``."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    prefix = 'tenure_sidecar_latency_seconds_bucket{le="'
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix) and 'route="chat"' in line:
            le = line[len(prefix) :].split('"', 1)[0]
            buckets[float(le)] = float(line.rsplit(" ", 1)[1])
    return buckets


def _bucket_quantile(buckets: dict[float, float], q: float) -> float:
    """Quantile by linear interpolation inside the histogram bucket that holds it."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return float("nan")
    target = q * ordered[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= target:
            if le == float("inf"):
                return lower_le
            span = count - lower_count
            return lower_le + (le - lower_le) * ((target - lower_count) / span if span else 0.0)
        lower_le, lower_count = le, count
    return lower_le


def run(args: argparse.Namespace) -> int:
    from service.cli import UsageError

    if args.concurrency < 1 or args.requests < args.concurrency:
        raise UsageError("--concurrency must be >= 1 and --requests >= --concurrency")
    if not args.rate > 0:
        raise UsageError("--rate must be > 0")
    redis_bin = shutil.which("redis-server")
    if redis_bin is None:
        raise UsageError("redis-server is not installed (apt-get install redis-server)")
    redis_port, upstream_port, sidecar_port = _free_port(), _free_port(), _free_port()
    hints = not args.no_hints
    with tempfile.TemporaryDirectory(prefix="tenure-bench-") as tmp:
        redis_argv = [
            redis_bin, "--port", str(redis_port), "--bind", "127.0.0.1", "--dir", tmp,
            "--save", "", "--appendonly", "no",
        ]  # fmt: skip
        env = {
            **os.environ,
            "TENURE_HOST": "127.0.0.1",
            "TENURE_PORT": str(sidecar_port),
            "TENURE_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
            "TENURE_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "TENURE_DEV_MODE": "1",
            "TENURE_PUSH_ADDR": f"tcp://127.0.0.1:{_free_port()}",
        }
        upstream_argv = [sys.executable, "-m", "service.api.bench_load", "--port"]
        sidecar_argv = [sys.executable, "-m", "service.cli", "serve", "--log-level", "warning"]
        with (
            _process(redis_argv, redis_port, "redis-server"),
            _process([*upstream_argv, str(upstream_port)], upstream_port, "upstream"),
            _process(sidecar_argv, sidecar_port, "sidecar", env) as sidecar,
        ):
            print(
                f"tenure bench proxy: concurrency {args.concurrency}, {args.requests} requests "
                f"per phase, latency at {args.rate:g} req/s, hints {'on' if hints else 'off'}, "
                "Redis on"
            )
            c, n, rate = args.concurrency, args.requests, args.rate
            direct = asyncio.run(_phase(upstream_port, c, n, hints, rate))
            proxied = asyncio.run(_phase(sidecar_port, c, n, hints, rate, sidecar.pid))
    result = {
        "concurrency": args.concurrency,
        "direct_p50_ms": round(direct["p50_ms"], 3),
        "direct_p99_ms": round(direct["p99_ms"], 3),
        "proxy_p50_ms": round(proxied["p50_ms"], 3),
        "proxy_p99_ms": round(proxied["p99_ms"], 3),
        "added_p50_ms": round(proxied["p50_ms"] - direct["p50_ms"], 3),
        "added_p99_ms": round(proxied["p99_ms"] - direct["p99_ms"], 3),
        "direct_rps": round(direct["rps"], 1),
        "proxy_rps": round(proxied["rps"], 1),
        "latency_offered_rps": args.rate,
        # CPU the sidecar process spent per proxied request in the throughput phase: the
        # figure that does not depend on what else shares the machine.
        "proxy_cpu_ms_per_request": round(proxied["cpu_ms_per_request"], 3),
        # The sidecar's own time per request (its histogram, upstream excluded) in the latency
        # phase: what the proxy adds before process scheduling on a shared machine.
        "in_sidecar_p50_ms": round(proxied["in_sidecar_p50_ms"], 3),
        "in_sidecar_p99_ms": round(proxied["in_sidecar_p99_ms"], 3),
    }
    for key, value in result.items():
        print(f"  {key:15s} {value}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
