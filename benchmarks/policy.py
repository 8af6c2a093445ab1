"""``tenure bench policy``: the adapter policy's cost per call beside vLLM's ``LRUCachePolicy``.

Both policies are driven through the same ``CachePolicy`` calls the offloading manager makes,
on the same synthetic agent workload: sessions that share a system prompt, grow their context
a few blocks per turn, end with a declared last turn and are replaced by new ones; a host tier
sized well below the live working set (4 blocks a session), so stores evict (or get refused). Per
request: ``get`` for each context block (lookup), ``on_store_miss`` + ``evict`` (when full) +
``insert`` + ``mark_evictable`` for the new blocks (store, transfer done), and
``on_request_finished`` (request-scoped access); ``evict`` is told what vLLM's manager
protects, the keys of the store being made. ``ns/op`` is this process's CPU time over those
calls (CPU time, not wall time: the figure must not depend on what else the machine runs). The
Tenure side runs as ``TenureOffloadingManager`` drives it, its extra manager hooks timed but not
counted: the record of each lookup (``Requests.looked_up``, from the manager's ``lookup``),
``begin_store`` (the gate decides the offer before vLLM's own calls, and tells the core what
the request looked up) and ``end_store`` around them, ``poll`` and ``take_released`` after.

Scaling: the same per-request work with 10 to 10,000 live sessions (tier sized per session).
The warm-up places every session at a random point of its life, so the timed requests carry the
same mix of context lengths at every scale: only the number of live sessions (and the memory
they occupy) changes. CPU time on a shared VM still moves by 10-30% between runs; each point is
the best of ``--repeats`` interleaved runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Measurement", "Workload", "configure", "measure", "run"]

BLOCK_TOKENS = 16
SYSTEM_BLOCKS = 2
MAX_CONTEXT_BLOCKS = 48
HOST_BLOCKS_PER_SESSION = 4
GAP_S = 5.0


@dataclass(frozen=True)
class Workload:
    sessions: int
    requests: int
    seed: int = 7


def _key(session_serial: int, index: int) -> Any:
    # 32-byte "block hash" + 4-byte group index, as vLLM's OffloadKey (a bytes NewType).
    return (session_serial * 4096 + index + 1).to_bytes(32, "big") + b"\0\0\0\0"


class _Clock:
    """The policy's clock, reading the driver's virtual time."""

    driver: Any = None

    def __call__(self) -> float:
        return float(self.driver.now) if self.driver is not None else 0.0


class _Driver:
    """Plays the offloading manager's part: chunk pool, transfer completion, request contexts."""

    def __init__(self, policy: Any, capacity: int, tenure: bool, sessions: int) -> None:
        self.policy = policy
        #: Virtual time: requests arrive every GAP_S / sessions seconds, so a session comes
        #: back about when it said it would (some early, some overdue: every class occurs).
        self.now = 0.0
        self.dt = GAP_S / sessions
        self.capacity = capacity
        self.tenure = tenure
        #: Tenure's manager's per-lookup hook (``None``: vLLM's own policy has none).
        self.looked_up: Any = policy.requests.looked_up if tenure else None
        self.next_chunk = 0
        self.free: list[Any] = []
        self.ops = 0
        self.stored = 0
        self.refused = 0
        from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

        # vLLM 0.33: insert(key, chunk, req_context) and the manager's on_request_access (the
        # request's keys, before the store's inserts); 0.32 has neither.
        self.request_scoped = hasattr(CachePolicy, "on_request_access")

    def chunk(self) -> Any:
        from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

        if self.free:
            chunk = self.free.pop()
            chunk.ref_cnt = -1
            return chunk
        self.next_chunk += 1
        return ChunkStatus(self.next_chunk)

    def prepare(self, serial: int, session: str, context: int, new: int, last: bool) -> Any:
        """Build the request's keys and context up front (vLLM's scheduler does this, not the
        policy), so only policy calls and the manager's own bookkeeping are timed."""
        from vllm.v1.kv_offload.base import ReqContext

        tags: dict[str, Any] = {"session_id": session, "expected_gap_ms": GAP_S * 1000}
        if last:
            tags["last_turn"] = True
        ctx = ReqContext(req_id=f"r{serial}-{context}", kv_transfer_params={"tenure": tags})
        keys = [_key(0, i) for i in range(SYSTEM_BLOCKS)]
        keys += [_key(serial, i) for i in range(SYSTEM_BLOCKS, context + new)]
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, (i + 1) * BLOCK_TOKENS)
        return ctx, keys, context

    def request(self, ctx: Any, keys: list[bytes], context: int) -> None:
        self.now += self.dt
        policy = self.policy
        get = policy.get
        if self.tenure:
            policy.on_new_request(ctx)
        ops = 0
        looked_up = self.looked_up
        for key in keys[:context]:  # lookup of the offloaded prefix
            ops += 1
            if looked_up is not None:
                looked_up(key, ctx)  # Tenure's manager records each lookup (a hook)
            if get(key) is None:
                break
        offer = [k for k in keys if get(k) is None]
        ops += len(keys)
        if offer:
            if self.tenure:
                # Tenure's manager decides the offer before vLLM's prepare_store runs (then
                # on_store_miss finds it decided): its production path, a hook not counted.
                policy.gate.begin_store(offer, ctx)
            policy.on_store_miss(offer, ctx)
            ops += 1
            if self.request_scoped:
                policy.on_request_access(keys, ctx)
                ops += 1
            need = len(offer) - (self.capacity - len(policy.chunks))
            stored = True
            if need > 0:
                ops += 1
                # vLLM's manager protects the keys of the store it is making (its offer: the
                # request's chunks not stored yet), not the request's whole context.
                evicted = policy.evict(need, set(offer))
                if evicted is None:
                    stored = False
                    self.refused += 1
                else:
                    self.free.extend(chunk for _, chunk in evicted)
            if stored:
                self.stored += len(offer)
                for key in offer:
                    chunk = self.chunk()
                    if self.request_scoped:
                        policy.insert(key, chunk, ctx)
                    else:
                        policy.insert(key, chunk)
                    chunk.ref_cnt = 0
                    policy.mark_evictable(key)
                ops += 2 * len(offer)
            if self.tenure:
                policy.gate.end_store()
        present = [k for k in keys if get(k) is not None]
        policy.on_request_finished((present,), set(), set(present), ctx)
        ops += 1 + len(keys)
        if self.tenure:
            policy.poll()
            self.free.extend(chunk for _, chunk in policy.take_released())
        self.ops += ops


def _plan(w: Workload) -> list[tuple[int, int, int, int, bool]]:
    """(session slot, serial, context blocks, new blocks, last turn) per request, warm-up first."""
    rng = random.Random(w.seed)
    serial = [i + 1 for i in range(w.sessions)]
    context = [0] * w.sessions
    next_serial = w.sessions + 1
    plan: list[tuple[int, int, int, int, bool]] = []
    order = list(range(w.sessions)) + [rng.randrange(w.sessions) for _ in range(w.requests)]
    for n, slot in enumerate(order):
        if n < w.sessions:
            # Warm-up: every session starts at a random point of its life (its context drawn
            # from the whole range), so the timed requests see the same mix of context lengths
            # whether 10 or 10,000 sessions are live, and only the session count varies.
            new = SYSTEM_BLOCKS + rng.randint(2, MAX_CONTEXT_BLOCKS - SYSTEM_BLOCKS - 4)
        else:
            new = rng.randint(2, 6) if context[slot] else SYSTEM_BLOCKS + rng.randint(2, 6)
        last = context[slot] + new >= MAX_CONTEXT_BLOCKS or rng.random() < 0.05
        plan.append((slot, serial[slot], context[slot], new, last))
        if last:
            serial[slot] = next_serial
            next_serial += 1
            context[slot] = 0
        else:
            context[slot] += new
    return plan


@dataclass(frozen=True)
class Measurement:
    """One policy on one workload: CPU time, calls made, requests and what the stores did."""

    cpu_ns: int
    ops: int
    requests: int
    stored_blocks: int
    refused_stores: int

    @property
    def ns_per_op(self) -> float:
        return self.cpu_ns / max(1, self.ops)

    @property
    def ns_per_request(self) -> float:
        return self.cpu_ns / max(1, self.requests)


def measure(policy_name: str, w: Workload) -> Measurement:
    """Drive ``policy_name`` (``vllm-lru`` or a core policy name) through workload ``w``."""
    capacity = w.sessions * HOST_BLOCKS_PER_SESSION
    if policy_name == "vllm-lru":
        from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

        driver = _Driver(LRUCachePolicy(cache_capacity=capacity), capacity, False, w.sessions)
    else:
        from tenure.engine_adapter.policies import policy_class_for

        clock = _Clock()
        policy = policy_class_for(policy_name)(cache_capacity=capacity, clock=clock)
        policy.can_release = True
        policy.requests.reports_lookups = True  # as Tenure's manager sets it
        policy.block_tokens = BLOCK_TOKENS
        driver = _Driver(policy, capacity, True, w.sessions)
        clock.driver = driver
    plan = _plan(w)
    warm = plan[: w.sessions]
    timed = plan[w.sessions :]
    for _slot, serial, context, new, last in warm:
        driver.request(*driver.prepare(serial, f"s{serial}", context, new, last))
    prepared = [driver.prepare(serial, f"s{serial}", c, n, last) for _, serial, c, n, last in timed]
    driver.ops = driver.stored = driver.refused = 0
    gc.collect()
    gc.disable()
    try:
        start = time.process_time_ns()
        for request in prepared:
            driver.request(*request)
        elapsed = time.process_time_ns() - start
    finally:
        gc.enable()
    return Measurement(elapsed, driver.ops, len(prepared), driver.stored, driver.refused)


def _best(results: list[Measurement]) -> Measurement:
    return min(results, key=lambda m: m.cpu_ns)


def run(
    *, requests: int, sessions: int, scaling: Sequence[int], policy: str, repeats: int
) -> dict[str, Any]:
    def compare(w: Workload, names: Sequence[str]) -> list[Measurement]:
        # Interleaved, best of ``repeats``: every side sees the same background load.
        runs: list[list[Measurement]] = [[] for _ in names]
        for _ in range(repeats):
            for i, name in enumerate(names):
                runs[i].append(measure(name, w))
        return [_best(r) for r in runs]

    base = Workload(sessions=sessions, requests=requests)
    # "lru" is the core's vLLM-exact LRU behind the adapter: the same decisions as vLLM's
    # LRUCachePolicy, so its cost over vLLM's is the adapter's own overhead.
    lru, ten, same = compare(base, ["vllm-lru", policy, "lru"])
    out: dict[str, Any] = {
        "policy": policy,
        "sessions": sessions,
        "requests": requests,
        "cpu_time": True,
        "vllm_lru_ns_per_op": round(lru.ns_per_op, 1),
        "tenure_ns_per_op": round(ten.ns_per_op, 1),
        "ratio": round(ten.ns_per_op / lru.ns_per_op, 3),
        "ns_per_request": {
            "vllm_lru": round(lru.ns_per_request),
            "tenure": round(ten.ns_per_request),
        },
        "request_ratio": round(ten.ns_per_request / lru.ns_per_request, 3),
        "adapter_lru_ns_per_op": round(same.ns_per_op, 1),
        "adapter_overhead_ratio": round(same.ns_per_op / lru.ns_per_op, 3),
        "calls": {"vllm_lru": lru.ops, "tenure": ten.ops, "adapter_lru": same.ops},
        "stored_blocks": {"vllm_lru": lru.stored_blocks, "tenure": ten.stored_blocks},
        "refused_stores": {"vllm_lru": lru.refused_stores, "tenure": ten.refused_stores},
        "scaling": [],
    }
    for n in scaling:
        w = Workload(sessions=n, requests=requests)
        v, t = compare(w, ["vllm-lru", policy])
        out["scaling"].append(
            {
                "sessions": n,
                "tenure_ns_per_op": round(t.ns_per_op, 1),
                "vllm_lru_ns_per_op": round(v.ns_per_op, 1),
                "tenure_ns_per_request": round(t.ns_per_request),
                "vllm_lru_ns_per_request": round(v.ns_per_request),
            }
        )
    return out


def plot_scaling(result: dict[str, Any], path: Path) -> None:
    """Cost per call against live sessions (log scale), the policy beside vLLM's LRU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["scaling"]
    sessions = [row["sessions"] for row in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(sessions, [row["tenure_ns_per_op"] for row in rows], "o-", color="#c44e52",
            label=f"{result['policy']} (adapter + decision core)")  # fmt: skip
    ax.plot(sessions, [row["vllm_lru_ns_per_op"] for row in rows], "s--", color="#4c72b0",
            label="vLLM LRUCachePolicy")  # fmt: skip
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("live sessions")
    ax.set_ylabel("CPU ns per CachePolicy call")
    ax.set_title(f"Policy cost per call ({result['requests']} requests per point, best of runs)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _main(args: argparse.Namespace) -> int:
    from tenure.service.errors import UsageError
    from tenure.service.policy import UnknownPolicyError, policy_class

    try:
        policy_class(args.policy)
    except UnknownPolicyError as exc:
        raise UsageError(str(exc)) from None
    if args.requests <= 0 or args.repeats <= 0 or any(n <= 0 for n in args.scaling):
        raise UsageError("--requests, --repeats and --scaling values must be positive")
    result = run(
        requests=args.requests,
        sessions=args.sessions,
        scaling=args.scaling,
        policy=args.policy,
        repeats=args.repeats,
    )
    r = result
    print(
        f"policy cost, CPU time ({args.requests} requests, {args.sessions} live sessions):\n"
        f"  per call:    vLLM LRUCachePolicy {r['vllm_lru_ns_per_op']:.0f} ns, "
        f"{args.policy} {r['tenure_ns_per_op']:.0f} ns, ratio {r['ratio']:.2f}\n"
        f"  per request: vLLM LRUCachePolicy {r['ns_per_request']['vllm_lru']} ns, "
        f"{args.policy} {r['ns_per_request']['tenure']} ns, ratio {r['request_ratio']:.2f} "
        f"(stored blocks {r['stored_blocks']['vllm_lru']} vs {r['stored_blocks']['tenure']}, "
        f"refused stores {r['refused_stores']['tenure']})\n"
        f"  adapter overhead (core LRU behind the adapter, same decisions as vLLM's): "
        f"{r['adapter_lru_ns_per_op']:.0f} ns/call, ratio {r['adapter_overhead_ratio']:.2f}"
    )
    print("  scaling in live sessions (per call / per request):")
    for row in r["scaling"]:
        print(
            f"  {row['sessions']:>6}: {args.policy} {row['tenure_ns_per_op']:>7.0f} ns"
            f" / {row['tenure_ns_per_request']:>9} ns"
            f"   vLLM LRU {row['vllm_lru_ns_per_op']:>6.0f} ns"
            f" / {row['vllm_lru_ns_per_request']:>9} ns"
        )
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")
    if args.plot:
        plot_scaling(result, Path(args.plot))
        print(f"wrote {args.plot}")
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--plot", metavar="PATH", help="also plot the scaling sweep (PNG)")
    parser.add_argument(
        "--policy", default="tenure", help="core policy to measure (default tenure)"
    )
    parser.add_argument("--requests", type=int, default=3000, help="timed requests per run")
    parser.add_argument("--sessions", type=int, default=100, help="live sessions, main comparison")
    parser.add_argument(
        "--scaling",
        type=int,
        nargs="+",
        default=[10, 100, 1000, 10000],
        help="live-session counts for the scaling sweep",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per point (best is kept)")
    parser.set_defaults(func=_main)
