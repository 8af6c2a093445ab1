"""``tenure calibrate-profile``: the CPU hardware profile of the live A/B's engine, measured.

With no ``--engine`` it starts the engine ``tenure up`` runs (the tiny model in float32, the
A/B's block size and batch limits; a host tier 4x the pool, so a flooded context can come back
from it), measures it (:mod:`tenure.service.calibrate.profile`), stops it, and prints the profile's
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

from tenure.service.errors import UsageError

__all__ = ["TINY_SHAPE", "configure"]


def _tiny_shape(layout: str = "tiny") -> Any:
    from tenure.service.calibrate.profile import ModelShape
    from tenure.service.live.stack import kv_bytes_per_block
    from tenure.service.tools.tiny_model import layout_named

    # The random-weight Llama (tenure.service.tools.tiny_model); for the tiny one (hidden 256, MLP
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
        "--cpus", type=int, default=0,
        help="run the engine on this many cores, one torch thread each, the model in its "
        "EngineCore process (what `tenure up --side-by-side` gives each arm); 0: all cores",
    )  # fmt: skip
    parser.add_argument(
        "--block-cost-blocks", type=int, default=32,
        help="context length (blocks) of the recompute-vs-load measurement (0: skip it)",
    )  # fmt: skip
    gpu = parser.add_argument_group(
        "GPU profile (--gpu): the replay's GPU physics measured with torch + transformers"
    )
    gpu.add_argument(
        "--gpu",
        action="store_true",
        help="measure prefill, decode and host-tier transfers on this CUDA host (no vLLM, no "
        "network; ~5 min on one H200) and write a profile file the replay loads by name",
    )
    gpu.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="with --gpu: every step on a tiny shape on the CPU (checks the run end to end)",
    )
    gpu.add_argument("--name", default=None, help="profile name (default h200-llama3-8b-measured)")
    gpu.add_argument(
        "--spec-profile",
        default="h200-llama3-8b",
        help="the public-spec profile whose peaks the measured efficiencies apply to",
    )
    gpu.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for <name>.json (default: service/replay/profiles, where the replay "
        "finds it)",
    )
    parser.set_defaults(func=run)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_gpu(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from tenure.service.calibrate.gpu_profile import (
        GpuProfilePlan,
        measure_gpu_profile,
        write_profile,
    )
    from tenure.service.replay.hardware import PROFILE_DIR, HardwareProfile, get_profile

    plan = GpuProfilePlan.cpu_dry_run() if args.cpu_dry_run else GpuProfilePlan()
    spec = asdict(get_profile(args.spec_profile))  # an unknown name fails before measuring
    plan = replace(plan, spec_profile=args.spec_profile, name=args.name or plan.name)
    out = args.out if args.out is not None else PROFILE_DIR
    if not out.is_dir():
        raise UsageError(f"--out {out}: not a directory")
    document = measure_gpu_profile(plan, spec, say=_say)
    HardwareProfile(**document["profile"])  # every field present and typed
    path = write_profile(document, out)
    p, fits = document["profile"], document["fits"]
    print(
        f"{p['name']} ({document['environment']['device']}, "
        f"{document['environment']['seconds']:.0f} s)\n"
        f"  mfu              = {p['mfu']:.3f}   "
        f"(prefill fit: {fits['effective_flops']:.4g} FLOP/s)\n"
        f"  hbm_efficiency   = {p['hbm_efficiency']:.3f}   "
        f"(decode fit: {fits['effective_hbm_bandwidth']:.4g} B/s)\n"
        f"  pcie_efficiency  = {p['pcie_efficiency']:.3f}   "
        f"(host loads: {fits['load_bandwidth']:.4g} B/s, stores {fits['store_bandwidth']:.4g})\n"
        f"  step_overhead_s  = {p['step_overhead_s']:.6g}\n"
        f"  transfer_latency = {p['transfer_latency_s']:.6g} s\n"
        f"wrote {path} (replay: --hardware {p['name']})"
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if args.gpu:
        return run_gpu(args)
    if args.cpu_dry_run:
        raise UsageError("--cpu-dry-run goes with --gpu")
    from tenure.service.calibrate.block_costs import measure_block_costs
    from tenure.service.calibrate.engine import EngineError, EngineProbe
    from tenure.service.calibrate.profile import measure_profile

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
        doc = {**m.to_dict(), "layout": args.layout, "cpus": args.cpus or None}
        if costs is not None:
            doc["block_costs"] = costs.to_dict()
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        _say(f"wrote {args.json}")
    return 0


def _start_engine(args: argparse.Namespace) -> Any:
    import os

    from tenure.service.live.cli import ENGINE_DEFAULTS
    from tenure.service.live.stack import ABStack, ABStackConfig
    from tenure.service.processes import StackError

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
        in_process_worker=args.cpus > 0,
        engine_cpus=tuple(sorted(os.sched_getaffinity(0))[: args.cpus]),
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
