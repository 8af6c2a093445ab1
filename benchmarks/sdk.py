"""``tenure bench sdk``: what the SDK adds to a completion call, measured in one run.

The same ``openai`` client (on an in-process transport, so the network does not drown the
figure) is called directly and through :class:`TenureSession`, in interleaved rounds; the best
round of each is kept, since on a shared machine only the fastest round is free of other
processes' noise. Hint building on its own is timed as well.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import openai

from tenure.clients._core import SessionCore
from tenure.clients.session import TenureSession

__all__ = ["configure", "measure"]

_REPLY = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
    }
).encode()


def _answer(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "application/json"}, content=_REPLY)


def _best_us(call: Callable[[], object], calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls * 1e6


def measure(calls: int = 200, rounds: int = 30) -> dict[str, Any]:
    client = openai.OpenAI(
        api_key="bench",
        base_url="http://bench.invalid/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(_answer)),
    )
    messages = [{"role": "user", "content": "hi"}]
    session = TenureSession(client, "bench-session", expected_gap_s=2.0, end_on_exit=False)
    core = SessionCore("bench-core", expected_gap_s=2.0)
    kwargs: dict[str, Any] = {"model": "m", "messages": messages}

    def direct() -> object:
        return client.chat.completions.create(model="m", messages=messages)  # type: ignore[arg-type]

    def through_sdk() -> object:
        return session.chat(model="m", messages=messages)

    def hints_only() -> object:
        return core.completion_kwargs(kwargs, last_turn=False, expected_gap_s=None, segment=None)

    for warm in (direct, through_sdk):
        _best_us(warm, min(calls, 200))
    direct_us: list[float] = []
    sdk_us: list[float] = []
    for _ in range(rounds):
        direct_us.append(_best_us(direct, calls))
        sdk_us.append(_best_us(through_sdk, calls))
    hint_us = min(_best_us(hints_only, calls * 20) for _ in range(rounds))
    session.close()
    client.close()
    best_direct, best_sdk = min(direct_us), min(sdk_us)
    return {
        "calls_per_round": calls,
        "rounds": rounds,
        "direct_us_per_call": round(best_direct, 2),
        "sdk_us_per_call": round(best_sdk, 2),
        "added_us_per_call": round(best_sdk - best_direct, 2),
        "hint_building_us_per_call": round(hint_us, 3),
    }


def _run(args: argparse.Namespace) -> int:
    from tenure.service.errors import UsageError

    if args.calls < 10 or args.rounds < 1:
        raise UsageError("--calls must be >= 10 and --rounds >= 1")
    result = measure(args.calls, args.rounds)
    print(f"openai client direct   {result['direct_us_per_call']:9.1f} us/call")
    print(f"through TenureSession  {result['sdk_us_per_call']:9.1f} us/call")
    print(f"added by the SDK       {result['added_us_per_call']:9.1f} us/call")
    print(f"hint building alone    {result['hint_building_us_per_call']:9.2f} us/call")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=200, help="calls per round")
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds (best kept)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.set_defaults(func=_run)


if __name__ == "__main__":
    cli = argparse.ArgumentParser(prog="python -m tenure.benchmarks.sdk", description=__doc__)
    configure(cli)
    ns = cli.parse_args()
    raise SystemExit(ns.func(ns))
