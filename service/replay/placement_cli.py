"""``tenure replay placement``: the Lachesis experiment on a Claude Code trace.

Bad input (a missing or malformed trace, a trace of another format, unknown hardware / SSD /
contender names, a bad ranker artefact, non-positive rates or capacities) raises
:class:`~tenure.service.errors.UsageError`: one line, exit code 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError

__all__ = ["add_placement_command"]


def add_placement_command(subs: Any) -> None:
    p = subs.add_parser(
        "placement", help="SSD-tier lifetime under lifetime-aware placement vs baselines"
    )
    p.add_argument("--trace", required=True, type=Path, help="Claude Code trace (jsonl.gz)")
    p.add_argument("--hardware", default="h100-llama3-8b", help="GPU/model profile")
    p.add_argument("--ssd", default="micron-7450-pro-3.84tb", help="SSD profile")
    p.add_argument("--dram-gib", default="16,32,64,128", help="host DRAM splits (GiB)")
    p.add_argument("--ssd-gib", default=None, help="SSD tier capacity (default: the device)")
    p.add_argument("--rates", default="0.0005,0.001,0.0015", help="root sessions per second")
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--slo-factor", default="2", help="SLO = factor x unloaded p95 turn JCT")
    p.add_argument("--reference-rate", default="0.0002", help="the unloaded reference load")
    p.add_argument("--contenders", default=None, help="comma-separated (default: all)")
    p.add_argument(
        "--ranker",
        type=Path,
        default=None,
        help="a train-ranker artefact to rank workers with (default: cross-fitted ridge)",
    )
    p.add_argument(
        "--fast-eviction",
        choices=("spill", "drop"),
        default="spill",
        help="what a fast-only worker block does if DRAM must evict it anyway",
    )
    p.add_argument("--max-sessions", default=None, help="replay the first N selected sessions")
    p.add_argument(
        "--all-sessions",
        action="store_true",
        help="every root session (default: those with sub-agents or reasoning calls)",
    )
    p.add_argument("--jobs", default=None, help="parallel processes (default: cores)")
    p.add_argument("--json", type=Path, default=None, help="write results JSON here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    p.set_defaults(func=_placement)


def _placement(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from tenure.service.errors import TraceError
    from tenure.service.policy.ranker import RankerArtefactError, RidgeRanker
    from tenure.service.replay.arguments import int_list, number
    from tenure.service.replay.experiment import default_jobs
    from tenure.service.replay.hardware import GIB, get_profile, get_ssd
    from tenure.service.replay.loaders import detect_format, load_trace
    from tenure.service.replay.loaders.claude_code_meta import load_claude_code_meta
    from tenure.service.replay.placement_exp import (
        CONTENDERS,
        PlacementSpec,
        Split,
        placement_sessions,
        run_placement,
    )
    from tenure.service.replay.placement_report import placement_table, plot_placement
    from tenure.service.replay.progress import ProgressBar
    from tenure.service.replay.reasoning import estimate_reasoning

    hardware = get_profile(args.hardware)
    ssd = get_ssd(args.ssd)
    dram = [number(v, "--dram-gib", positive=True) for v in args.dram_gib.split(",") if v.strip()]
    if not dram:
        raise UsageError("--dram-gib is empty")
    ssd_bytes = None
    if args.ssd_gib is not None:
        ssd_bytes = number(args.ssd_gib, "--ssd-gib", positive=True) * GIB
    rates = tuple(
        sorted({number(v, "--rates", positive=True) for v in args.rates.split(",") if v.strip()})
    )
    if not rates:
        raise UsageError("--rates is empty")
    seeds = int_list(args.seeds, "--seeds")
    slo_factor = number(args.slo_factor, "--slo-factor", positive=True)
    reference_rate = number(args.reference_rate, "--reference-rate", positive=True)
    jobs = int_list(args.jobs, "--jobs")[0] if args.jobs is not None else default_jobs()
    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    contenders = CONTENDERS
    if args.contenders is not None:
        known = {c.name: c for c in CONTENDERS}
        names = [n.strip() for n in args.contenders.split(",") if n.strip()]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise UsageError(f"unknown contender(s) {bad or names}; valid: {', '.join(known)}")
        contenders = tuple(known[n] for n in names)
    artefact = None
    if args.ranker is not None:
        try:
            artefact = RidgeRanker.load(args.ranker)
        except RankerArtefactError as exc:
            raise UsageError(str(exc)) from None
        contenders = tuple(
            replace(c, ranker="artefact") if c.ranker.startswith("ridge") else c for c in contenders
        )
    for out in (args.json, args.plot):
        if out is not None and not out.parent.is_dir():
            raise UsageError(f"{out}: the directory {out.parent} does not exist")
    if not args.trace.is_file():
        raise UsageError(f"{args.trace}: no such trace file")
    try:
        if detect_format(args.trace) != "claude-code":
            raise UsageError(
                f"{args.trace}: placement needs the Claude Code format (sub-agent records, "
                "output types)"
            )
        trace = load_trace(args.trace, "claude-code")
        meta = load_claude_code_meta(args.trace)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    reasoning = estimate_reasoning(meta)
    roots = trace.roots if args.all_sessions else placement_sessions(trace, meta, reasoning)
    if args.max_sessions is not None:
        n = int_list(args.max_sessions, "--max-sessions")[0]
        if n < 1:
            raise UsageError("--max-sessions must be at least 1")
        roots = roots[:n]
    trace = trace.subset(roots)
    kept = {s.id for s in trace.sessions}
    spawns = [s for s in meta.spawns if s.worker in kept]
    splits = tuple(Split(g, ssd, ssd_bytes) for g in dram)
    spec = PlacementSpec(
        hardware,
        splits,
        rates,
        seeds,
        contenders,
        slo_factor,
        reference_rate,
        args.fast_eviction,
        {
            "trace": str(args.trace),
            "root_sessions": len(trace.roots),
            "sessions": len(trace.sessions),
            "workers": len(spawns),
            "selection": "all" if args.all_sessions else "sub-agents or reasoning calls",
            "block_tokens": trace.block_tokens,
        },
    )
    bar = ProgressBar("placement")
    doc = run_placement(trace, spec, reasoning, spawns, jobs, artefact, bar.update)
    bar.close()
    print(placement_table(doc))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    if args.plot is not None:
        plot_placement(doc, args.plot)
    return 0
