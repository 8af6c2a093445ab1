"""``tenure train-ranker``: fit the worker-lifetime ranker on a trace and save the artefact.

Prints the session-grouped k-fold cross-validated Kendall tau of the ridge ranker on the base
spawn features, the ridge and a pairwise ranker on the extended ones (the parent's spawning
call and the session's earlier workers), beside the simple heuristics (by sub-agent type, by
size, by position in a fan-out, by how many workers the session spawned before), then fits the
final model on every spawn (ridge penalty chosen by leave-one-session-out) and writes it as
JSON: the artefact the adapter and the sidecar load
(:meth:`tenure.service.policy.ranker.RidgeRanker.load`). ``--features`` picks its feature set:
``extended`` (the default: the sidecar derives every extended fact live, as the replay does,
:mod:`tenure.service.policy.spawn_context`) or ``base`` (the spawn's own facts and its place in the
session only).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError

__all__ = ["configure", "evaluation_table"]

#: The seed's cross-validated Kendall tau (Lachesis, Figure 7).
SEED_TAU = 0.53


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", required=True, type=Path, help="Claude Code trace (jsonl.gz)")
    parser.add_argument("--out", required=True, type=Path, help="where to write the artefact")
    parser.add_argument("--folds", default="5", help="session-grouped folds (default 5)")
    parser.add_argument("--json", type=Path, default=None, help="write the evaluation here")
    parser.add_argument(
        "--features",
        choices=("base", "extended"),
        default="extended",
        help="the artefact's spawn features (default: extended; the sidecar fills them all)",
    )
    parser.set_defaults(func=_train)


def _fmt(v: float) -> str:
    return "  n/a" if v is None or math.isnan(v) else f"{v:+.3f}"


def evaluation_table(cv: dict[str, Any]) -> str:
    lines = [
        f"worker ranker: {cv['workers']} sub-agents in {cv['sessions']} sessions, "
        f"session-grouped {cv['folds']}-fold cross-validation (seed reports tau = {SEED_TAU})",
        f"{'ranker':<18} {'tau (pooled)':>13} {'tau (within session)':>21} {'pairs':>6} "
        f"{'tau (fold mean)':>16}",
    ]
    for name, r in cv["rankers"].items():
        lines.append(
            f"{name:<18} {_fmt(r['kendall_tau']):>13} {_fmt(r['kendall_tau_within_session']):>21}"
            f" {r['within_session_pairs_ordered']:>6} {_fmt(r['kendall_tau_fold_mean']):>16}"
        )
    lines.append(f"ridge (base) penalties chosen per fold: {cv['ridge_alphas']}")
    lines.append(
        "base: sub-agent type and model, sizes, background, the parent's turn and context, "
        "fan-out position, session time; extended adds the spawning call's output, reasoning, "
        "human turn and gap, and the session's earlier workers (count, returned, their mean "
        "lifetime); pairwise-extended: a logistic ranker on same-session pairs"
    )
    lines.append(
        "pooled: all out-of-fold predictions against all lifetimes; within session: only pairs "
        "of the same session (what the predictive path ranks), 'pairs' = pairs the ranker does "
        "not tie; fold mean: mean of per-fold taus"
    )
    return "\n".join(lines)


def _train(args: argparse.Namespace) -> int:
    from tenure.service.errors import TraceError
    from tenure.service.policy.ranker import FEATURE_SETS
    from tenure.service.policy.ranker_fit import cross_validate, fit_ridge, grouped_folds
    from tenure.service.replay.arguments import int_list
    from tenure.service.replay.loaders import detect_format
    from tenure.service.replay.loaders.claude_code_meta import load_claude_code_meta

    folds = int_list(args.folds, "--folds")[0]
    if folds < 2:
        raise UsageError("--folds must be at least 2")
    for out in (args.out, args.json):
        if out is not None and not out.parent.is_dir():
            raise UsageError(f"{out}: the directory {out.parent} does not exist")
    if not args.trace.is_file():
        raise UsageError(f"{args.trace}: no such trace file")
    try:
        if detect_format(args.trace) != "claude-code":
            raise UsageError(f"{args.trace}: train-ranker reads the Claude Code trace format")
        meta = load_claude_code_meta(args.trace)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    spawns = meta.spawns
    sessions = {s.session for s in spawns}
    if len(spawns) < 4 or len(sessions) < 2:
        raise UsageError(
            f"{args.trace}: {len(spawns)} sub-agent spawns in {len(sessions)} sessions; "
            "need at least 4 spawns in 2 sessions to train and evaluate"
        )
    cv = cross_validate(spawns, folds)
    print(evaluation_table(cv))
    from tenure.service.policy.ranker_fit import _choose_alpha

    numeric = FEATURE_SETS[args.features]

    def fit(train: Any, a: float) -> Any:
        return fit_ridge(train, a, numeric=numeric)

    alpha = _choose_alpha(spawns, fit)
    # The artefact is strict JSON: an undefined tau (a constant ranker) is written as null.
    summary = {
        name: {
            k: (None if isinstance(v, float) and math.isnan(v) else v)
            for k, v in r.items()
            if k != "kendall_tau_folds"
        }
        for name, r in cv["rankers"].items()
    }
    model = fit_ridge(
        spawns,
        alpha,
        {
            "trained_on": {
                "trace": args.trace.name,
                "workers": len(spawns),
                "sessions": len(sessions),
                "folds": len(grouped_folds([s.session for s in spawns], folds)),
                "feature_set": args.features,
            },
            "evaluation": summary,
        },
        numeric,
    )
    model.save(args.out)
    print(
        f"ridge on the {args.features} features, penalty {alpha:g} (leave-one-session-out); "
        f"artefact written to {args.out}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(cv, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    return 0
