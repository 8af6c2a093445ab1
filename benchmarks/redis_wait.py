"""``tenure bench redis-wait``: what ``WAIT 1`` after each lifecycle script costs per request.

Starts a real master + replica (+ Sentinels, as deployed) on 127.0.0.1 and times the store's
hot-path script calls (``apply`` of an idle-turn update, the write every proxied turn ends
with) through the multiplexed connection, with ``TENURE_REDIS_WAIT_REPLICAS`` 0 (asynchronous
replication, the default) and 1, sequentially and with ``--concurrency`` calls in flight.
With WAIT, Redis blocks the connection until the replica acknowledged the write, so calls on
the one multiplexed connection queue behind each other's replication round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["configure"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=3000, help="calls per phase (default 3000)")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight (default 32)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.set_defaults(func=run)


async def _phase(store: Any, calls: int, concurrency: int) -> dict[str, float]:
    from tenure.service.state.records import SessionUpdate
    from tenure.service.wire.push import Decision

    latencies: list[float] = []
    counter = iter(range(calls))

    async def worker() -> None:
        for i in counter:
            update = SessionUpdate(
                fields={"state": "idle", "expected_gap_s": "5.0"}, live_score=time.time() + 5,
                decision=Decision(seq=0, session_id=f"b/s{i % 500}", state="idle", turn=1),
            )  # fmt: skip
            started = time.perf_counter()
            await store.apply("b", f"s{i % 500}", update, now=time.time())
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "p50_us": round(ordered[len(ordered) // 2] * 1e6, 1),
        "p99_us": round(ordered[int(0.99 * len(ordered))] * 1e6, 1),
        "calls_per_s": round(calls / elapsed, 1),
    }


async def _measure(group: Any, calls: int, concurrency: int) -> dict[str, Any]:
    from tenure.service.state.breaker import Breaker
    from tenure.service.state.keys import Keys
    from tenure.service.state.records import SessionUpdate
    from tenure.service.state.store import StateStore
    from tenure.service.state.topology import RedisTopology, connect

    topology = RedisTopology(url="redis://127.0.0.1:6379/0", sentinels=tuple(
        ("127.0.0.1", s.port) for s in group.sentinels), master_name=group.name)  # fmt: skip
    out: dict[str, Any] = {}
    for wait in (0, 1):
        client = connect(topology, socket_timeout_s=2.0, connect_timeout_s=2.0)
        short: list[int] = []
        store = StateStore(
            client, Keys.build("bench"), Breaker(1.0), wait_replicas=wait, wait_timeout_ms=1000,
            on_short_wait=short.append,
        )  # fmt: skip
        for session in range(500):  # the records exist: every call is a plain update
            await store.apply(
                "b", f"s{session}", SessionUpdate(fields={"state": "idle"}), now=time.time()
            )
        await _phase(store, 200, 4)  # warm-up
        out[f"wait_{wait}"] = {
            "sequential": await _phase(store, calls // 4, 1),
            f"concurrency_{concurrency}": await _phase(store, calls, concurrency),
            "short_waits": len(short),
        }
        await store.aclose()
        await client.aclose()
    return out


def run(args: argparse.Namespace) -> int:
    from tenure.service.processes.redis_groups import SentinelGroup

    with tempfile.TemporaryDirectory() as tmp, SentinelGroup(Path(tmp)) as group:
        result = asyncio.run(_measure(group, args.calls, args.concurrency))
    seq0, seq1 = result["wait_0"]["sequential"], result["wait_1"]["sequential"]
    result["added_p50_us_sequential"] = round(seq1["p50_us"] - seq0["p50_us"], 1)
    key = f"concurrency_{args.concurrency}"
    result["throughput_ratio_concurrent"] = round(
        result["wait_1"][key]["calls_per_s"] / result["wait_0"][key]["calls_per_s"], 3
    )
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0
