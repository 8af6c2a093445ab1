"""``tenure calibrate-profile``: the CPU hardware profile of the live A/B's engine, measured.

With no ``--engine`` it starts the engine ``tenure up`` runs (the tiny model in float32, the
A/B's block size and batch limits; a host tier 4x the pool, so a flooded context can come back
from it), measures it (:mod:`service.calibrate.profile`), stops it, and prints the profile's
fields with the measurement's spread; ``--json`` writes both. ``--engine URL`` measures a
running engine instead (its model shape must be the tiny model's).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from service.errors import UsageError

__all__ = ["TINY_SHAPE", "configure"]


def _tiny_shape(layout: str = "tiny") -> Any:
    from service.calibrate.profile import ModelShape
    from service.live.stack import kv_bytes_per_block
    from service.tools.tiny_model import layout_named

    # The random-weight Llama (service.tools.tiny_model); for the tiny one (hidden 256, MLP
    # 512, 2 layers, vocabulary 2051) matmul parameters = 2 x (4 x 256^2 + 3 x 256 x 512) +
    # 256 x 2051.
    shape = layout_named(layout)
    params = shape.matmul_params
    return ModelShape(
        params=float(params),
        weight_bytes=float(params * 4),  # float32
        layers=shape.layers,
        attention_width=shape.hidden,
        kv_bytes_per_token=kv_bytes_per_block(1, layout),
    )


TINY_SHAPE = _tiny_shape


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", default=None, help="measure this vLLM server instead")
    parser.add_argument("--repeats", type=int, default=5, help="requests per figure (median)")
    parser.add_argument("--json", type=Path, default=None, help="write the measurement here")
    parser.add_argument(
        "--cache-dir", default=None, help="where the tiny model is cached (default ~/.cache)"
    )
    parser.add_argument(
        "--layout", default="demo", choices=("demo", "tiny"),
        help="which random-weight model to start (demo: tenure up's; tiny: the tests')",
    )  # fmt: skip
    parser.add_argument(
        "--block-cost-blocks", type=int, default=32,
        help="context length (blocks) of the recompute-vs-load measurement (0: skip it)",
    )  # fmt: skip
    parser.set_defaults(func=run)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from service.calibrate.block_costs import measure_block_costs
    from service.calibrate.engine import EngineError, EngineProbe
    from service.calibrate.profile import measure_profile

    if args.repeats < 1:
        raise UsageError("--repeats must be >= 1")
    if args.json is not None and not args.json.parent.is_dir():
        raise UsageError(f"{args.json}: the directory {args.json.parent} does not exist")
    stack = None
    url = args.engine
    try:
        if url is None:
            stack = _start_engine(args)
            url = stack.engine_url
        probe = EngineProbe(url, timeout_s=300)
        try:
            probe.discover()
            _say(f"measuring {url} ({args.repeats} requests per figure)")
            m = measure_profile(probe, _tiny_shape(args.layout), repeats=args.repeats, say=_say)
            costs = (
                measure_block_costs(
                    probe, context_blocks=args.block_cost_blocks, repeats=args.repeats, say=_say
                )
                if args.block_cost_blocks > 0
                else None
            )
        except EngineError as exc:
            raise UsageError(str(exc)) from None
        finally:
            probe.close()
    finally:
        if stack is not None:
            stack.stop()
            shutil.rmtree(stack.config.workdir, ignore_errors=True)
    print(
        f"engine {m.engine}: {m.gpu_blocks} KV blocks of {m.block_tokens} tokens\n"
        f"  step_overhead_s          = {m.step_overhead_s:.6g}   (median decode step, short)\n"
        f"  hbm_bandwidth_per_gpu    = {m.memory_bandwidth:.6g}   (B/s, KV read by decode)\n"
        f"  bf16_dense_flops_per_gpu = {m.effective_flops:.6g}   (FLOP/s fit to prefill)\n"
        f"  pcie_bandwidth_per_gpu   = {m.host_copy_bandwidth:.6g}   (B/s, host-tier loads)\n"
        f"  prefill (tokens, s)      = "
        + ", ".join(f"{n}: {t:.4f}" for n, t in m.prefill)
        + "".join(f"\nnote: {n}" for n in m.notes)
        + (f"\n  block costs              = {costs.describe()} (TTFT, median)" if costs else "")
        + "".join(f"\nnote: {n}" for n in (costs.notes if costs else ()))
    )
    if args.json is not None:
        doc = {**m.to_dict(), "layout": args.layout}
        if costs is not None:
            doc["block_costs"] = costs.to_dict()
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        _say(f"wrote {args.json}")
    return 0


def _start_engine(args: argparse.Namespace) -> Any:
    import os

    from service.live.cli import ENGINE_DEFAULTS
    from service.live.stack import ABStack, ABStackConfig
    from service.processes import StackError

    cache = Path(
        args.cache_dir or os.environ.get("TENURE_CACHE_DIR") or Path.home() / ".cache" / "tenure"
    )
    workdir = Path(tempfile.mkdtemp(prefix="tenure-profile-"))
    gpu = 200
    config = ABStackConfig(
        workdir=workdir,
        model_cache=cache / "models",
        policy="lru",
        lru_impl="stock",
        layout=args.layout,
        gpu_blocks=gpu,
        host_blocks=4 * gpu,
        **ENGINE_DEFAULTS,
    )
    stack = ABStack(config, progress=lambda line: _say(f"calibrate-profile: {line}"))
    try:
        stack.ensure_model()
        stack.start_engine()
    except StackError as exc:
        stack.stop()
        raise UsageError(str(exc)) from None
    except BaseException:
        stack.stop()
        raise
    return stack
