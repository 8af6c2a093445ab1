"""``tenure replay ttl``: the approval-gate host TTL replay (seed 002's Table 6, and a drift day).

Bad input (an unknown family or platform, a non-positive price, C2, W_ref or load, a missing
trace) raises :class:`~tenure.service.errors.UsageError`: one line, exit code 2, before any work
starts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError
from tenure.service.replay.arguments import output_dirs

__all__ = ["configure"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--families",
        default="lognormal,exponential,mixture,claude-code",
        help="wait families: lognormal, exponential, mixture, claude-code (real human gaps)",
    )
    parser.add_argument("--loads", default="0.5,1,2,3", help="loads, multiples of lambda_crit")
    parser.add_argument("--requests", default="4000", help="suspended contexts per replay")
    parser.add_argument("--c2", default="425", help="host slots C2 (suspended contexts)")
    parser.add_argument("--w-ref", default="1800", help="reference wait W_ref, seconds")
    parser.add_argument(
        "--platform", default="h100-nvl", help="price-vector preset: h100-nvl, a100-sxm, l40s"
    )
    parser.add_argument(
        "--price", default=None, help="alpha1,beta2,beta3 (GPU-s/s, GPU-s, GPU-s): overrides"
    )
    parser.add_argument("--replicates", default="5", help="independent traces per cell")
    parser.add_argument("--calibration-samples", default="4000", help="calibration waits")
    parser.add_argument(
        "--calibration-load", default="2", help="load the seed's controller is calibrated at"
    )
    parser.add_argument(
        "--estimator", default=None, help="online lambda estimator, e.g. window:900"
    )
    parser.add_argument(
        "--lambda-z", default=None,
        help="price t2 with the lambda estimate this many standard errors low (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--margin", default=None, help="online controller's switching margin (default 0.05)"
    )
    parser.add_argument(
        "--timer", choices=("repriced", "oneshot"), default="repriced",
        help="held copies' timers: re-priced by the rent clock while lambda moves (default), "
        "or fixed at t2 of the lambda at suspension (the seed's)",
    )  # fmt: skip
    parser.add_argument("--seed", default="0", help="base seed")
    parser.add_argument(
        "--spread-seeds", default="",
        help="more base seeds (e.g. 1,2,3,4): rerun Table 6 under each and report each "
        "controller's gain per cell across all of them (mean, sd, range, shortfalls)",
    )  # fmt: skip
    parser.add_argument("--trace", type=Path, default=None, help="Claude Code trace (human gaps)")
    parser.add_argument(
        "--claude-scaling", choices=("pooled", "half"), default="pooled",
        help="claude-code: scale both halves by the pooled mean (default: one time unit, as "
        "a deployment sees seconds) or each half to W_ref by its own mean (issue 13's family)",
    )  # fmt: skip
    parser.add_argument("--no-drift", action="store_true", help="skip the non-stationary day")
    parser.add_argument("--drift-replicates", default="3", help="replicates of the drift day")
    parser.add_argument("--json", type=Path, default=None, help="write results JSON here")
    parser.add_argument("--plot", type=Path, default=None, help="write a PNG plot here")
    parser.set_defaults(func=run)


def _number(text: str, name: str, *, integer: bool = False) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name} must be a positive number, got {text!r}")
    if integer and value != int(value):
        raise UsageError(f"{name} must be a whole number, got {text!r}")
    return value


def _float_arg(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise UsageError(f"{name} must be a non-negative number, got {text!r}")
    return value


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _model(args: argparse.Namespace) -> Any:
    from tenure.service.policy.platforms import get_platform
    from tenure.service.policy.retention import PriceVector
    from tenure.service.policy.retention_costs import RetentionModel

    try:
        if args.price is not None:
            parts = [p.strip() for p in args.price.split(",")]
            if len(parts) != 3:
                raise UsageError(f"--price must be alpha1,beta2,beta3, got {args.price!r}")
            values = []
            for name, part in zip(("alpha1", "beta2", "beta3"), parts, strict=True):
                try:
                    values.append(float(part))
                except ValueError:
                    raise UsageError(f"--price {name} must be a number, got {part!r}") from None
            price = PriceVector(*values)
        else:
            price = get_platform(args.platform).price
        c2 = _number(args.c2, "--c2", integer=True)
        return RetentionModel(price, c2, _number(args.w_ref, "--w-ref"))
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _families(args: argparse.Namespace, w_ref: float) -> list[Any]:
    from tenure.service.replay.paths import claude_code_trace
    from tenure.service.replay.ttl_families import FAMILY_NAMES, human_turn_gaps, synthetic_family

    names = [n.strip() for n in args.families.split(",") if n.strip()]
    if not names:
        raise UsageError("--families is empty")
    out = []
    for name in names:
        if name not in FAMILY_NAMES:
            raise UsageError(f"unknown wait family {name!r}; valid: {', '.join(FAMILY_NAMES)}")
        if name == "claude-code":
            trace = args.trace or claude_code_trace()
            gaps = human_turn_gaps(trace)
            _say(
                f"claude-code: {len(gaps.calibration)} + {len(gaps.heldout)} human-turn gaps "
                f"(calibration + held-out) from {gaps.sessions} sessions of {trace}, raw mean "
                f"{gaps.raw_mean_s:.0f} s, scaled to {w_ref:.0f} s ({args.claude_scaling})"
            )
            out.append(gaps.family(w_ref, args.claude_scaling))
        else:
            out.append(synthetic_family(name, w_ref))
    return out


def run(args: argparse.Namespace) -> int:
    from tenure.service.policy.rate import rate_estimator
    from tenure.service.policy.retention_control import OnlineSettings
    from tenure.service.replay.progress import ProgressBar
    from tenure.service.replay.ttl_drift import DEFAULT_ESTIMATORS, DriftSpec, run_drift
    from tenure.service.replay.ttl_families import synthetic_family
    from tenure.service.replay.ttl_report import (
        drift_table,
        fine_spread_table,
        plot_ttl,
        rule_table,
        spread_table,
        table6_table,
    )
    from tenure.service.replay.ttl_table6 import Table6Spec, run_table6, seed_spread

    model = _model(args)
    loads = [_number(v, "--loads") for v in args.loads.split(",") if v.strip()]
    if not loads:
        raise UsageError("--loads is empty")
    requests = int(_number(args.requests, "--requests", integer=True))
    replicates = int(_number(args.replicates, "--replicates", integer=True))
    calib_n = int(_number(args.calibration_samples, "--calibration-samples", integer=True))
    calib_load = _number(args.calibration_load, "--calibration-load")
    drift_reps = int(_number(args.drift_replicates, "--drift-replicates", integer=True))
    seed = int(float(args.seed)) if args.seed.strip().lstrip("-").isdigit() else None
    if seed is None:
        raise UsageError(f"--seed must be an integer, got {args.seed!r}")
    spread_seeds: list[int] = []
    for part in (p.strip() for p in args.spread_seeds.split(",")):
        if part and not part.lstrip("-").isdigit():
            raise UsageError(f"--spread-seeds must be integers, got {part!r}")
        if part and int(part) != seed and int(part) not in spread_seeds:
            spread_seeds.append(int(part))
    estimators = list(DEFAULT_ESTIMATORS)
    if args.estimator is not None:
        try:
            rate_estimator(args.estimator)
        except ValueError as exc:
            raise UsageError(f"--estimator: {exc}") from None
        estimators = [args.estimator, *(e for e in estimators if e != args.estimator)]
    knobs: dict[str, Any] = {"estimator": estimators[0]}
    if args.lambda_z is not None:
        knobs["lambda_z"] = _float_arg(args.lambda_z, "--lambda-z")
    if args.margin is not None:
        knobs["margin"] = _float_arg(args.margin, "--margin")
    knobs["timer"] = args.timer
    try:
        online = OnlineSettings(**knobs)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    output_dirs(args.json, args.plot)
    families = _families(args, model.w_ref_s)

    started = time.monotonic()
    spec = Table6Spec(
        model, families, loads, requests, calib_n, calib_load, replicates, seed, online
    )
    _say(
        f"table 6: {len(families)} families x {len(loads)} loads x {replicates} replicates, "
        f"{requests} contexts each, C2={model.slots}, lambda_crit={model.lambda_crit:.4f}/s"
    )
    bar = ProgressBar("table 6")
    cells = run_table6(spec, bar.update)
    bar.close()
    print(table6_table(cells))
    print()
    print(rule_table(cells))
    runs = {seed: cells}
    for extra in spread_seeds:
        bar = ProgressBar(f"table 6, seed {extra}")
        runs[extra] = run_table6(replace(spec, seed=extra), bar.update)
        bar.close()
    doc: dict[str, Any] = {
        "config": {
            "price": {
                "alpha1": model.price.alpha1,
                "beta2": model.price.beta2,
                "beta3": model.price.beta3,
            },
            "t1_s": model.price.t1,
            "t_star_s": model.price.t_star,
            "c2": model.slots,
            "w_ref_s": model.w_ref_s,
            "lambda_crit_per_s": model.lambda_crit,
            "platform": None if args.price else args.platform,
            "requests": requests,
            "replicates": replicates,
            "calibration_samples": calib_n,
            "calibration_load": calib_load,
            "seed": seed,
            "claude_scaling": args.claude_scaling,
            "online": {
                "estimator": online.estimator,
                "period_s": online.period_s,
                "margin": online.margin,
                "window": online.window,
                "min_samples": online.min_samples,
                "evaluator": online.evaluator,
                "censored": online.censored,
                "lambda_z": online.lambda_z,
                "timer": online.timer,
            },
        },
        "cells": cells,
    }
    if spread_seeds:
        doc["seed_spread"] = seed_spread(runs)
        print()
        print(spread_table(doc["seed_spread"]))
        print()
        print(fine_spread_table(doc["seed_spread"]))
    if not args.no_drift:
        w_ref = model.w_ref_s
        fams = {n: synthetic_family(n, w_ref) for n in ("lognormal", "mixture")}
        drift_spec = DriftSpec(
            model, fams, estimators=estimators, online=online, calibration_samples=calib_n,
            replicates=drift_reps, seed=seed,
        )  # fmt: skip
        _say(f"drift day: {drift_reps} replicates, {len(drift_spec.estimators)} estimators")
        bar = ProgressBar("drift")
        doc["drift"] = run_drift(drift_spec, bar.update)
        bar.close()
        print()
        print(drift_table(doc["drift"]))
    _say(f"done in {time.monotonic() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        _say(f"wrote {args.json}")
    if args.plot is not None:
        plot_ttl(doc, args.plot)
        _say(f"wrote {args.plot}")
    return 0
