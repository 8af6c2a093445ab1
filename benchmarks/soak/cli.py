"""``tenure bench soak``: two sidecar replicas on Redis with Sentinel and a replica, vllm-router,
two engines, agent sessions from the real trace at a steady rate, and a fault schedule.

Faults, at fixed fractions of the run (each healed before the next):

* 20%: the Redis master is killed (SIGKILL); the Sentinels promote the replica; the old master
  comes back as a replica 5 s after the promotion;
* 40%: sidecar-1 is killed and started again 10 s later (clients fail over to sidecar-0);
* 60%: engine-1 is killed and started again 10 s later (the router moves its sessions);
* 80%: the push channel is cut for 15 s (fake engines: the stand-in adapters disconnect and
  reconnect, resyncing from a snapshot; vLLM engines: sidecar-0 is paused with SIGSTOP).

Engines: ``--engine fake`` (default) is the canned upstream of ``tenure bench proxy`` behind
the router, with a real push-channel adapter per engine (the engine adapter's own
``PushClient`` and policy, no vLLM) connected to each sidecar; ``--engine vllm`` runs two CPU
vLLM servers with the tiny model and the Tenure adapter.

Reported (``--json``): the proxied success ratio (all turns, and outside the seconds an engine
is down or a sidecar is dead), acknowledged lifecycle writes lost outside the failover window,
ledger mismatches, sidecar RSS and Redis memory growth (least-squares slope after warm-up,
MiB per hour), p99 latency inside and outside fault windows, and every fault with its times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from tenure.service.processes import http_json

__all__ = ["configure"]

DEFAULT_TRACE = "../shared/traces/claude_code/sessions.jsonl.gz"
#: Acknowledged writes this close before a master kill may be lost (asynchronous replication).
WINDOW_S = 1.0
#: Seconds after an engine / sidecar fault during which proxied failures are excused (the
#: router's health checks and the client's failover need them).
FAULT_SLACK_S = 5.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="run length (default 10)")
    parser.add_argument(
        "--engine", choices=("fake", "vllm"), default="fake",
        help="fake: canned upstream + push-channel adapters (a pure sidecar soak); vllm: CPU vLLM",
    )  # fmt: skip
    parser.add_argument("--sessions-per-s", type=float, default=0.5, help="new sessions per s")
    parser.add_argument("--time-scale", type=float, default=0.02, help="trace gap multiplier")
    parser.add_argument("--max-gap-s", type=float, default=4.0, help="longest gap between turns")
    parser.add_argument("--trace", default=DEFAULT_TRACE, help="claude-code trace file")
    parser.add_argument("--no-faults", action="store_true", help="steady traffic only")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--plot", type=Path, help="write a plot over time here (PNG)")
    parser.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir)")
    parser.add_argument(
        "--render", type=Path, metavar="RESULT_JSON",
        help="run nothing: recompute the plateau verdict of a saved run (RESULT_JSON and its "
        "_series.json) and redraw --plot",
    )  # fmt: skip
    parser.set_defaults(func=run)


def _rss_mib(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _redis_used_mib(port: int | None) -> float | None:
    from tenure.service.processes.redis_groups import redis_command

    if port is None:
        return None
    for line in redis_command(port, "INFO", "memory").split("\r\n"):
        if line.startswith("used_memory:"):
            return int(line.split(":")[1]) / 2**20
    return None


class _Adapters:
    """Stand-in engine adapters for fake engines: the adapter's real push client and policy."""

    def __init__(self, ports: list[int], engines: int) -> None:
        self.ports = ports
        self.engines = engines
        self.clients: list[Any] = []

    def start(self) -> None:
        from tenure.engine_adapter.policies import policy_class_for
        from tenure.engine_adapter.push_client import PushClient

        for i in range(self.engines):
            policy = policy_class_for("tenure")(cache_capacity=1024)
            client = PushClient(
                f"tcp://127.0.0.1:{self.ports[i % len(self.ports)]}", policy,
                engine_id=f"engine-{i}", adapter_id=f"engine-{i}", report_interval_s=1.0,
                hello_interval_s=1.0,
            )  # fmt: skip
            client.start()
            self.clients.append(client)

    def drain(self) -> None:
        for client in self.clients:
            client.policy.poll()

    def stop(self) -> None:
        for client in self.clients:
            client.stop()
        self.clients = []


def run(args: argparse.Namespace) -> int:
    from tenure.benchmarks.soak.driver import plans_from_trace
    from tenure.service.cli import UsageError

    if args.render is not None:
        return _rerender(args.render, args.plot)
    if args.minutes <= 0 or args.sessions_per_s <= 0:
        raise UsageError("--minutes and --sessions-per-s must be positive")
    trace = Path(args.trace)
    if not trace.is_file():
        raise UsageError(f"trace {trace} not found (run from the project root, or pass --trace)")
    plans = plans_from_trace(
        str(trace), time_scale=args.time_scale, max_gap_s=args.max_gap_s,
        suspend_above_s=60.0, max_turns=60,
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        result = _soak(args, plans, workdir)
    _print(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({k: v for k, v in result.items() if k != "series"}, indent=2) + "\n"
        )
        args.json.with_name(args.json.stem + "_series.json").write_text(
            json.dumps(result["series"]) + "\n"
        )
    if args.plot:
        from tenure.benchmarks.soak.report import plot

        plot(result, args.plot)
    return 0


def _rerender(path: Path, plot_path: Path | None) -> int:
    from tenure.benchmarks.soak.report import rerender
    from tenure.service.cli import UsageError

    series = path.with_name(path.stem + "_series.json")
    if not path.is_file() or not series.is_file():
        raise UsageError(f"--render needs {path} and {series} from a saved run")
    _print(rerender(path, plot_path))
    return 0


def _soak(args: argparse.Namespace, plans: list[Any], workdir: Path) -> dict[str, Any]:
    from tenure.benchmarks.soak.driver import drive
    from tenure.benchmarks.soak.ledger import Ledger
    from tenure.benchmarks.soak.report import summarize
    from tenure.service.stack.multi import MultiStack, MultiStackConfig

    fake = args.engine == "fake"
    config = MultiStackConfig(
        workdir=workdir, model_cache=_model_cache(), fake_engines=fake, sentinel=True,
        sidecar_env={"TENURE_PUSH_SNAPSHOT_INTERVAL_S": "5"},
    )  # fmt: skip
    duration = args.minutes * 60
    progress = _progress
    multi = MultiStack(config, progress)
    adapters = _Adapters(multi.push_ports, config.engines) if fake else None
    faults: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    ledger = Ledger()
    with multi:
        if adapters is not None:
            adapters.start()
            multi.wait_adapters({f"engine-{i}" for i in range(config.engines)}, timeout=30)
        t0 = time.monotonic()
        urls = [multi.sidecar_url(i) for i in range(config.sidecars)]
        stop = asyncio.Event()

        async def sample_forever() -> None:
            said_at = 0.0
            seen = 0
            failed = 0
            while not stop.is_set():
                sentinel = multi.sentinel
                master = sentinel.master_port() if sentinel is not None else None
                row: dict[str, Any] = {"t": round(time.monotonic() - t0, 2)}
                for i, process in enumerate(multi.sidecars):
                    pid = process.process.pid if process is not None and process.process else None
                    row[f"rss_mib_{i}"] = _rss_mib(pid)
                row["redis_mib"] = await asyncio.to_thread(_redis_used_mib, master)
                row["turns"] = len(ledger.turns)
                samples.append(row)
                # A line a minute, so an hour's run shows it is alive (and when it stops
                # being answered) without waiting for the report.
                failed += sum(1 for turn in ledger.turns[seen:] if turn.status != 200)
                seen = len(ledger.turns)
                if row["t"] - said_at >= 60:
                    said_at = row["t"]
                    rss = "/".join(
                        f"{row[k]:.0f}" if row[k] is not None else "-"
                        for k in sorted(row)
                        if k.startswith("rss_mib_")
                    )
                    redis_mib = row["redis_mib"]
                    progress(
                        f"t={row['t'] / 60:.0f} min: {seen:,} turns, {failed:,} first attempts "
                        f"not 200, {len(ledger.acks):,} acknowledged writes, sidecar RSS {rss} "
                        f"MiB, Redis "
                        + (f"{redis_mib:.1f} MiB" if redis_mib is not None else "unreachable")
                    )
                if adapters is not None:
                    adapters.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 5.0)

        async def fault_schedule() -> None:
            if args.no_faults:
                return
            schedule = [(0.2, _kill_redis_master), (0.4, _bounce_sidecar), (0.6, _bounce_engine),
                        (0.8, _cut_push)]  # fmt: skip
            for fraction, fault in schedule:
                delay = t0 + fraction * duration - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                record = await asyncio.to_thread(fault, multi, adapters, t0)
                progress(f"fault: {record['kind']} ({record})")
                faults.append(record)

        async def main() -> None:
            sampler = asyncio.ensure_future(sample_forever())
            injector = asyncio.ensure_future(fault_schedule())
            try:
                await drive(
                    urls, plans, sessions_per_s=args.sessions_per_s, duration_s=duration,
                    t0=t0, ledger=ledger,
                )  # fmt: skip
                await injector
            finally:
                stop.set()
                injector.cancel()
                await sampler

        progress(
            f"soak: {args.minutes:g} min, {args.sessions_per_s:g} sessions/s, engine={args.engine}"
        )
        asyncio.run(main())
        records, read_at = _read_back(urls[0], list(ledger.acks), t0)
        kills = [f["at_s"] for f in faults if f["kind"] == "redis_master_killed"]
        checks = ledger.check(
            records, kills, WINDOW_S, read_at=read_at, finished_ttl_s=_finished_ttl_s()
        )
        engines = http_json("GET", f"{urls[0]}/admin/engines", timeout=10)["engines"]
        moves = sum(int(e["sessions_moved_in"]) for e in engines)
        if adapters is not None:
            adapters.stop()
    return summarize(
        args=vars(args), ledger=ledger, checks=checks, faults=faults, samples=samples,
        duration_s=duration, slack_s=FAULT_SLACK_S, engines=engines, moves=moves,
    )  # fmt: skip


def _finished_ttl_s() -> float:
    """The sidecars' ``finished_ttl_s`` (they inherit this process's environment)."""
    from tenure.service.settings import Settings

    return float(
        os.environ.get("TENURE_FINISHED_TTL_S", Settings.model_fields["finished_ttl_s"].default)
    )


def _model_cache() -> Path:
    root = os.environ.get("TENURE_CACHE_DIR") or Path.home() / ".cache" / "tenure"
    return Path(root) / "models"


def _read_back(
    url: str, sessions: list[str], t0: float
) -> tuple[dict[str, dict[str, Any] | None], dict[str, float]]:
    """Each session's record (``None``: not found) and when it was asked for (seconds since
    ``t0``): an hour's sessions take tens of seconds to read, and ends expire meanwhile."""
    import httpx

    out: dict[str, dict[str, Any] | None] = {}
    read_at: dict[str, float] = {}
    with httpx.Client(base_url=url, timeout=10) as http:
        for session in sessions:
            read_at[session] = time.monotonic() - t0
            reply = http.get(f"/v1/sessions/{session}")
            out[session] = reply.json() if reply.status_code == 200 else None
    return out, read_at


def _kill_redis_master(multi: Any, _adapters: Any, t0: float) -> dict[str, Any]:
    group = multi.sentinel
    start = time.monotonic()
    old = group.kill_master()
    new = group.wait_failover(old, timeout=60)
    promoted = time.monotonic()
    time.sleep(5)
    group.restart(old)
    return {
        "kind": "redis_master_killed", "at_s": round(start - t0, 2),
        "healed_s": round(promoted - t0, 2), "failover_s": round(promoted - start, 2),
        "old_master": old.port, "new_master": new.port,
    }  # fmt: skip


def _bounce_sidecar(multi: Any, _adapters: Any, t0: float) -> dict[str, Any]:
    start = time.monotonic()
    multi.kill_sidecar(1)
    time.sleep(10)
    multi.start_sidecar(1)
    return {"kind": "sidecar_killed", "replica": 1, "at_s": round(start - t0, 2),
            "healed_s": round(time.monotonic() - t0, 2)}  # fmt: skip


def _bounce_engine(multi: Any, _adapters: Any, t0: float) -> dict[str, Any]:
    start = time.monotonic()
    multi.kill_engine(1)
    time.sleep(10)
    multi.start_engine(1)
    return {"kind": "engine_killed", "engine": "engine-1", "at_s": round(start - t0, 2),
            "healed_s": round(time.monotonic() - t0, 2)}  # fmt: skip


def _cut_push(multi: Any, adapters: Any, t0: float) -> dict[str, Any]:
    start = time.monotonic()
    if adapters is not None:
        adapters.stop()
        time.sleep(15)
        adapters.start()
        how = "adapters disconnected, then reconnected (Hello -> snapshot)"
    else:
        process = multi.sidecars[0].process
        os.kill(process.pid, signal.SIGSTOP)
        time.sleep(15)
        os.kill(process.pid, signal.SIGCONT)
        how = "sidecar-0 paused (SIGSTOP) for 15 s"
    return {"kind": "push_channel_cut", "how": how, "at_s": round(start - t0, 2),
            "healed_s": round(time.monotonic() - t0, 2)}  # fmt: skip


def _progress(line: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {line}", flush=True)


def _print(result: dict[str, Any]) -> None:
    keys = [
        "turns", "proxied_success_ratio", "proxied_success_ratio_outside_faults",
        "acknowledged_writes", "acknowledged_writes_lost", "acknowledged_writes_lost_in_window",
        "ledger_mismatches", "session_moves", "rss_growth_mib_per_hour",
        "redis_growth_mib_per_hour", "p99_latency_ms_outside_faults",
        "p99_latency_ms_during_faults",
    ]  # fmt: skip
    for key in keys:
        print(f"{key:40s} {result.get(key)}")
    plateau = result.get("plateau") or {}
    for name, curve in plateau.get("curves", {}).items():
        verdict = {True: "flat", False: "NOT FLATTENED", None: "unknown"}[curve.get("flat")]
        print(
            f"plateau {name:24s} {verdict:14s} {curve.get('slope_mib_per_hour')} MiB/h over "
            f"t = {plateau['window_s'][0]:g}-{plateau['window_s'][1]:g} s"
        )
    for fault in result["faults"]:
        print(
            f"fault {fault['kind']:24s} at {fault['at_s']:7.1f}s healed {fault['healed_s']:7.1f}s"
        )
