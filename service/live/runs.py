"""How ``tenure up``'s arms run: each on its own fresh stack (Redis, sidecar, engine).

The full run starts each arm's stack after the previous arm's stopped (the issue's rule: the
engine restarted between arms, nothing else running beside an arm). ``--quick`` starts every
arm's stack at once and then runs the arms in turn (:func:`_started_together`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["run_arms"]

Say = Callable[[str], None]


def run_arms(
    args: argparse.Namespace,
    arms: list[str],
    params: dict[str, dict[str, float]],
    sizing: Any,
    cache: Path,
    root: Path,
    played: tuple[Any, Any, list[tuple[float, int]]],
    say: Say,
    engine: dict[str, Any],
    plan: Any = None,
) -> tuple[dict[str, Any], list[Any]]:
    """Per arm: start its fresh stack (the ``engine`` settings, the pool and tier of
    ``sizing``), run the arm, stop the stack (the last one stays up with ``--keep-running``)."""
    from tenure.service.live.arm import run_arm
    from tenure.service.live.stack import ABStack, ABStackConfig

    work, etrace, schedule = played
    side_by_side = bool(getattr(args, "side_by_side", False)) and plan is not None
    cpus = sorted(os.sched_getaffinity(0))
    stacks: dict[str, ABStack] = {}
    for i, name in enumerate(arms):
        keep = args.keep_running and i == len(arms) - 1
        config = ABStackConfig(
            workdir=root / name,
            model_cache=cache / "models",
            policy=name,
            proxy_port=args.port if keep else 0,
            gpu_blocks=sizing.gpu_blocks,
            host_blocks=sizing.host_blocks,
            lru_impl=args.lru_impl,
            layout=args.layout,
            policy_params=params[name],
            in_process_worker=args.quick or side_by_side,
            engine_cpus=(cpus[i % len(cpus)],) if side_by_side else (),
            sidecar_env=(
                {"TENURE_RECORD_ENABLED": "true"}
                if args.record is not None and i == len(arms) - 1
                else {}
            ),
            **{
                **engine,
                # vLLM refuses a max_model_len its pool cannot hold (one block is its null
                # block).
                "max_model_len": min(
                    engine["max_model_len"],
                    (sizing.gpu_blocks - 1) * engine["block_tokens"],
                ),
            },
        )
        stacks[name] = ABStack(config, progress=lambda line, n=name: say(f"[{n}] {line}"))
    if side_by_side:
        return _side_by_side(args, arms, stacks, played, say, plan)
    if args.quick:
        return _started_together(args, arms, stacks, played, say, plan)
    # One engine at a time: an idle CPU vLLM worker beside a running one was measured spinning
    # a whole core (one of this VM's two), which slowed the first arm ~10x and would hand
    # the second arm a quieter machine than the first.
    results = {}
    for i, name in enumerate(arms):
        stack = stacks[name]
        try:
            stack.start()
            results[name] = run_arm(stack, work, etrace, schedule, say, plan=plan)
            if args.record is not None and i == len(arms) - 1:
                _export_recording(stack, args.record, etrace.block_tokens, say)
        except BaseException:
            stack.stop()
            raise
        if not (args.keep_running and i == len(arms) - 1):
            stack.stop()
    return results, [stacks[arms[-1]]] if args.keep_running else []


def _started_together(
    args: argparse.Namespace,
    arms: list[str],
    stacks: dict[str, Any],
    played: tuple[Any, Any, list[tuple[float, int]]],
    say: Say,
    plan: Any = None,
) -> tuple[dict[str, Any], list[Any]]:
    """``--quick``: every arm's stack starts at once (two ~20-40 s engine starts overlap on
    two cores instead of following each other), then the arms run one after the other, each
    on its own engine that has served nothing before its arm; each stack stops after its arm.

    What the waiting stacks cost the running arm is measured (CPU seconds of their process
    groups over the arm) and said: an idle engine with its worker in the EngineCore process
    measured ~1.5% of a core here, where an engine still starting takes a whole one (which is
    why nothing starts while an arm runs).
    """
    from tenure.service.live.arm import run_arm
    from tenure.service.live.stack import group_cpu_seconds

    work, etrace, schedule = played
    results: dict[str, Any] = {}
    try:
        for name in arms:
            stacks[name].launch()
        for name in arms:
            stacks[name].wait_ready()
        for i, name in enumerate(arms):
            stack = stacks[name]
            waiting = [g for later in arms[i + 1 :] for g in stacks[later].process_groups()]
            before = group_cpu_seconds(waiting)
            results[name] = run_arm(stack, work, etrace, schedule, say, plan=plan)
            after = group_cpu_seconds(waiting)
            if waiting and before is not None and after is not None:
                share = (after - before) / max(results[name].wall_s, 1e-9)
                results[name].waiting_cpu_share = share
                say(f"[{name}] the stacks still waiting used {share:.1%} of a core during this arm")
            if args.record is not None and i == len(arms) - 1:
                _export_recording(stack, args.record, etrace.block_tokens, say)
            if not (args.keep_running and i == len(arms) - 1):
                stack.stop()
    except BaseException:
        for stack in stacks.values():
            stack.stop()
        raise
    return results, [stacks[arms[-1]]] if args.keep_running else []


def _side_by_side(
    args: argparse.Namespace,
    arms: list[str],
    stacks: dict[str, Any],
    played: tuple[Any, Any, list[tuple[float, int]]],
    say: Say,
    plan: Any,
) -> tuple[dict[str, Any], list[Any]]:
    """``--side-by-side``: every arm's stack starts at once, each engine on a core of its own,
    and the arms play together, each call sent to every arm at the same moment (one gate for
    all arms, :class:`~tenure.service.live.dispatch.Gate`). Played one after the other, the
    arms met different moments of a shared machine, and a change of background load between
    them moved the latency figures by more than the effect; side by side, a pair of calls
    meets the same load, so the paired per-call differences cancel it."""
    from tenure.service.live.arm import run_arms_side_by_side

    work, etrace, schedule = played
    try:
        for name in arms:
            stacks[name].launch()
        for name in arms:
            stacks[name].wait_ready()
        played_arms = run_arms_side_by_side(
            [stacks[n] for n in arms], work, etrace, schedule, say, plan=plan
        )
        results = dict(zip(arms, played_arms, strict=True))
        if args.record is not None:
            _export_recording(stacks[arms[-1]], args.record, etrace.block_tokens, say)
    except BaseException:
        for stack in stacks.values():
            stack.stop()
        raise
    for i, name in enumerate(arms):
        if not (args.keep_running and i == len(arms) - 1):
            stacks[name].stop()
    return results, [stacks[arms[-1]]] if args.keep_running else []


def _export_recording(stack: Any, out: Path, block_tokens: int, say: Say) -> None:
    """The treatment arm's recorded traffic, exported through its sidecar's admin REST."""
    import urllib.request

    url = f"{stack.proxy_url}/admin/record/export?block_tokens={block_tokens}"
    with urllib.request.urlopen(url, timeout=60) as response:
        text = response.read().decode()
    out.write_text(text, encoding="utf-8")
    say(f"recorded the {stack.config.policy} arm's traffic: {out} ({text.count(chr(10)) - 1} "
         "sessions, canonical format)")  # fmt: skip
