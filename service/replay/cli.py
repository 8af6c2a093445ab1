"""``tenure replay ladder`` and ``tenure replay sweep``: the policy ladder on a trace.

(``tenure replay ttl``, the approval-gate host TTL replay, lives in
:mod:`tenure.service.replay.ttl_cli`; ``tenure replay placement``, SSD-tier placement, in
:mod:`tenure.service.replay.placement_cli`.)

Bad input (a malformed or truncated trace, an unknown policy or hardware name, a negative rate
or capacity) raises :class:`~tenure.service.errors.UsageError`: one line, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError
from tenure.service.replay.arguments import int_list, number

__all__ = ["configure"]


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, type=Path, help="trace file")
    parser.add_argument(
        "--format",
        choices=("claude-code", "mooncake", "canonical"),
        default=None,
        help="trace format (default: detected from the first line)",
    )
    parser.add_argument("--policies", default=None, help="comma-separated (default: all)")
    parser.add_argument("--arrival-rate", default="0.005", help="root sessions per second")
    parser.add_argument("--host-gib", default="128", help="host tier capacity in GiB")
    parser.add_argument("--hardware", default="h100-llama3-8b", help="hardware profile")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--max-sessions", default=None, help="replay the first N root sessions")
    parser.add_argument("--boot", default="1000", help="bootstrap replicates (0: no intervals)")
    parser.add_argument("--jobs", default=None, help="parallel processes (default: cores)")
    parser.add_argument(
        "--paired-vs",
        default=None,
        help="baselines for paired p95 deltas (default: lru,notier when replayed)",
    )
    parser.add_argument(
        "--no-bound",
        action="store_true",
        help="skip the per-run bound on saved prefill work (the saved/bound column)",
    )
    parser.add_argument(
        "--ends",
        choices=("declared", "inferred", "none"),
        default="declared",
        help="how sessions' ends are known: each session's final turn declares it (declared, "
        "the default), only the sidecar's inferred ends a recorded trace marks (inferred), "
        "or none",
    )
    parser.add_argument("--json", type=Path, default=None, help="write results JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")


def configure(parser: argparse.ArgumentParser) -> None:
    subs = parser.add_subparsers(
        dest="replay_command", metavar="COMMAND", parser_class=type(parser)
    )
    ladder = subs.add_parser("ladder", help="every policy at one operating point")
    _add_common(ladder)
    ladder.set_defaults(func=_ladder)
    sweep = subs.add_parser("sweep", help="the ladder along arrival rate or host capacity")
    _add_common(sweep)
    sweep.add_argument("--param", required=True, choices=("arrival-rate", "host-gib"))
    sweep.add_argument("--values", required=True, help="comma-separated values")
    sweep.set_defaults(func=_sweep)
    from tenure.service.replay import ttl_cli
    from tenure.service.replay.placement_cli import add_placement_command

    ttl_cli.configure(
        subs.add_parser("ttl", help="approval-gate host TTL: Table 6 and a drift day")
    )
    add_placement_command(subs)

    def _no_command(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=_no_command)


class _Options:
    """Validated command-line options (all bad input rejected before any work starts)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from tenure.service.policy import UnknownPolicyError, policy_class
        from tenure.service.replay.experiment import all_policies, default_jobs, order_policies
        from tenure.service.replay.hardware import get_profile

        self.rate = number(args.arrival_rate, "--arrival-rate", positive=True)
        self.host_gib = number(args.host_gib, "--host-gib", positive=False)
        self.hardware = get_profile(args.hardware)
        self.seeds = int_list(args.seeds, "--seeds")
        if len(set(self.seeds)) != len(self.seeds):
            raise UsageError(f"--seeds lists a seed twice: {args.seeds!r}")
        self.boot = int_list(args.boot, "--boot")[0]
        self.jobs = int_list(args.jobs, "--jobs")[0] if args.jobs is not None else default_jobs()
        if self.jobs < 1:
            raise UsageError("--jobs must be at least 1")
        self.max_sessions: int | None = None
        if args.max_sessions is not None:
            self.max_sessions = int_list(args.max_sessions, "--max-sessions")[0]
            if self.max_sessions < 1:
                raise UsageError("--max-sessions must be at least 1")
        if args.policies is None:
            self.policies = all_policies()
        else:
            names = [p.strip() for p in args.policies.split(",") if p.strip()]
            if not names:
                raise UsageError("--policies is empty")
            for name in names:
                try:
                    policy_class(name)
                except UnknownPolicyError as exc:
                    raise UsageError(str(exc)) from None
            self.policies = order_policies(names)
        if args.paired_vs is None:
            self.paired_vs = tuple(p for p in ("lru", "notier") if p in self.policies)
        else:
            self.paired_vs = tuple(p.strip() for p in args.paired_vs.split(",") if p.strip())
            missing = [p for p in self.paired_vs if p not in self.policies]
            if missing:
                raise UsageError(f"--paired-vs {','.join(missing)}: not among --policies")
        self.trace_path: Path = args.trace
        self.ends: str = args.ends
        self.format: str | None = args.format
        self.json: Path | None = args.json
        self.plot: Path | None = args.plot
        self.no_bound: bool = args.no_bound
        for out in (self.json, self.plot):
            if out is not None and not out.parent.is_dir():
                raise UsageError(f"{out}: the directory {out.parent} does not exist")

    def load(self) -> Any:
        from tenure.service.replay.loaders import load_trace

        trace = load_trace(self.trace_path, self.format)
        if self.max_sessions is not None:
            trace = trace.subset(trace.roots[: self.max_sessions])
        return trace

    def spec(self) -> Any:
        from tenure.service.replay.experiment import LadderSpec

        return LadderSpec(
            tuple(self.policies),
            self.hardware,
            self.rate,
            self.host_gib,
            self.seeds,
            self.boot,
            self.paired_vs,
            ends=self.ends,
            bound=not self.no_bound,
        )

    def extra(self, trace: Any) -> dict[str, Any]:
        return {
            "trace": str(self.trace_path),
            "format": self.format or "auto",
            "max_sessions": self.max_sessions,
            "root_sessions": len(trace.roots),
            "block_tokens": trace.block_tokens,
        }


def _ladder(args: argparse.Namespace) -> int:
    from tenure.service.replay.experiment import build_ladder, ladder_configs, run_grid
    from tenure.service.replay.progress import ProgressBar
    from tenure.service.replay.table import ladder_table

    opts = _Options(args)
    trace = opts.load()
    spec = opts.spec()
    bar = ProgressBar("replay")
    runs = run_grid(trace, ladder_configs(spec), opts.jobs, bar.update)
    bar.close()
    ladder = build_ladder(spec, runs, opts.extra(trace))
    print(ladder_table(ladder))
    _write(opts, ladder, "ladder")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from tenure.service.replay.experiment import build_ladder, ladder_configs, run_grid, sweep_specs
    from tenure.service.replay.progress import ProgressBar
    from tenure.service.replay.table import ladder_table

    opts = _Options(args)
    positive = args.param == "arrival-rate"
    values = [number(v, "--values", positive=positive) for v in args.values.split(",") if v.strip()]
    if not values:
        raise UsageError("--values is empty")
    trace = opts.load()
    specs = sweep_specs(opts.spec(), args.param, values)
    configs = [c for spec in specs for c in ladder_configs(spec)]
    bar = ProgressBar("sweep")
    runs = run_grid(trace, configs, opts.jobs, bar.update)
    bar.close()
    per = len(configs) // len(specs)
    points = []
    for i, spec in enumerate(specs):
        ladder = build_ladder(spec, runs[i * per : (i + 1) * per], opts.extra(trace))
        print(f"\n{args.param} = {values[i]}")
        print(ladder_table(ladder))
        points.append(ladder)
    sweep = {"param": args.param, "values": values, "points": points}
    _write(opts, sweep, "sweep")
    return 0


def _write(opts: _Options, doc: dict[str, Any], kind: str) -> None:
    from tenure.service.replay.plot import plot_ladder, plot_sweep

    if opts.json is not None:
        opts.json.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    if opts.plot is not None:
        (plot_ladder if kind == "ladder" else plot_sweep)(doc, opts.plot)
