"""``tenure bench proxy``'s measurement: the requests it sends, the latency rounds (direct and
every sidecar alternating, open loop at a fixed rate), the throughput phase (closed loop, the
sidecar's CPU per request), and the sidecar's own time per request read from its ``/metrics``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tenure.benchmarks.cpus import cpu_seconds
from tenure.benchmarks.proxy_load import run_load
from tenure.benchmarks.stats import bucket_quantile, percentile

__all__ = ["ROUTES", "measure"]

#: ``--route`` name -> upstream path.
ROUTES = {"chat": "/v1/chat/completions", "messages": "/v1/messages"}


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


async def measure(
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
