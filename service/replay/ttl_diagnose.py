"""Why a Table 6 cell lands where it does: ``python -m tenure.service.replay.ttl_diagnose``.

For one family at one load (default: the mixture at 2 x lambda_crit, the cell the acceptance
is tightest on) it measures, on many independent held-out traces (paired: every policy on the
same trace):

* ``timers``: the cost of host timers around ``t2(lambda)`` and of the seed's fixed ones, with
  how the contexts resumed (host hits, expired copies, refused admissions) - the seed's
  accounting charges nothing for holding (``alpha2 = 0``), so the whole cost is the recomputes;
* ``calibration``: the seed's branch choice (ttl - retain, relative, by replaying a
  calibration sample as an episode at the calibration load) across independent calibration
  samples, per sample size and per number of arrival streams averaged
  (:data:`~tenure.service.policy.retention_costs.EPISODE_DRAWS`), and how often it picks the branch
  that loses on average;
* ``lambda``: the ttl branch with ``t2`` at the lambda estimated online, against ``t2`` at the
  configured lambda, for one-shot and re-priced timers (:mod:`tenure.service.policy.rent`), with the
  estimator started cold (as in Table 6) and warmed by an hour of the same suspension stream
  (what a long-running deployment has).

Deterministic (seeded); the numbers are quoted in ``results/ttl/README.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from tenure.service.policy.platforms import get_platform
from tenure.service.policy.rate import rate_estimator
from tenure.service.policy.retention_control import OneShotController
from tenure.service.policy.retention_costs import RetentionModel, branch_costs
from tenure.service.replay.ttl_families import SYNTHETIC_FAMILIES, WaitFamily, synthetic_family
from tenure.service.replay.ttl_policies import OneShotPolicy
from tenure.service.replay.ttl_sim import poisson_arrivals, replay_policy, replay_timers
from tenure.service.replay.ttl_table6 import FIXED_TIMERS

__all__ = ["calibration_spread", "lambda_cost", "main", "timer_curve"]

HOUR = 3600.0


def _trace(
    family: WaitFamily, lam: float, n: int, rep: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 11, rep])
    return poisson_arrivals(n, lam, rng), family.sample(n, rng, "heldout")


def timer_curve(
    model: RetentionModel, family: WaitFamily, load: float, reps: int, n: int, seed: int
) -> list[dict[str, Any]]:
    """Mean cost per timer, its paired difference to the 30-minute timer, and the outcomes."""
    lam = load * model.lambda_crit
    t2 = model.t2(lam)
    timers: dict[str, float | None] = {"cpu_ttl": t2}
    if t2 is not None:
        timers.update({f"{f:g} x t2": f * t2 for f in (0.8, 0.9, 1.1, 1.25, 1.5)})
    timers.update(FIXED_TIMERS)
    costs: dict[str, list[float]] = {k: [] for k in timers}
    outcomes: dict[str, list[list[int]]] = {k: [] for k in timers}
    for rep in range(reps):
        arrivals, waits = _trace(family, lam, n, rep, seed)
        for name, ttl in timers.items():
            ttls = np.full(n, np.inf if ttl is None else ttl)
            result = replay_timers(arrivals, waits, ttls, model.slots, model.price)
            costs[name].append(result.mean_cost)
            outcomes[name].append(list(result.outcome_counts(waits).values()))
    ref = np.array(costs["30min"])
    rows = []
    for name, ttl in timers.items():
        c = np.array(costs[name])
        rel = (c - ref) / ref
        hits, expired, refused = np.mean(outcomes[name], axis=0)
        rows.append({
            "timer": name, "ttl_s": ttl, "cost": float(c.mean()), "cost_sd": float(c.std()),
            "vs_30min": float(rel.mean()), "vs_30min_se": float(rel.std() / np.sqrt(reps)),
            "host_hits": float(hits), "expired": float(expired), "refused": float(refused),
        })  # fmt: skip
    return rows


def calibration_spread(
    model: RetentionModel,
    family: WaitFamily,
    calibration_load: float,
    sizes: Sequence[int],
    draws: Sequence[int],
    samples: int,
    seed: int,
) -> list[dict[str, Any]]:
    """(ttl - retain) / retain of the seed's episode score across calibration samples."""
    lam = calibration_load * model.lambda_crit
    rows = []
    for n in sizes:
        for k in draws:
            gaps = []
            for rep in range(samples):
                rng = np.random.default_rng([seed, 12, n, rep])
                waits = family.sample(n, rng, "calibration").tolist()
                c = branch_costs(model, waits, lam, evaluator="episode", seed=rep, draws=k)
                gaps.append((c.ttl - c.retain) / c.retain)
            g = np.array(gaps)
            # The controller picks ttl where it is strictly cheaper (retain wins ties).
            loser = "ttl" if g.mean() > 0 else "retain"
            wrong = int((g < 0).sum()) if loser == "ttl" else int((g >= 0).sum())
            rows.append({
                "samples_n": n, "draws": k, "mean": float(g.mean()), "sd": float(g.std()),
                "picks_the_loser": wrong, "of": samples, "loser": loser,
            })  # fmt: skip
    return rows


def lambda_cost(
    model: RetentionModel,
    family: WaitFamily,
    load: float,
    reps: int,
    n: int,
    seed: int,
    estimator: str,
    lambda_z: float,
    warm_s: float,
    repriced: bool = False,
) -> dict[str, float]:
    """The ttl branch with t2 at the estimated lambda, relative to t2 at the configured one
    (``repriced``: the rent clock's timers, else fixed at each suspension's estimate)."""
    lam = load * model.lambda_crit
    t2 = model.t2(lam)
    if t2 is None:
        raise ValueError("the load is not congested: t2 is infinite, nothing to estimate")
    calibration = family.sample(1000, np.random.default_rng([seed, 13]), "calibration")
    rel = []
    for rep in range(reps):
        arrivals, waits = _trace(family, lam, n, rep, seed)
        base = replay_timers(arrivals, waits, np.full(n, t2), model.slots, model.price)
        controller = OneShotController(model, lam=lam, calibration_waits_s=calibration.tolist())
        controller.branch = "ttl"  # the branch is not what this measures
        est = rate_estimator(estimator)
        if warm_s > 0:
            rng = np.random.default_rng([seed, 14, rep])
            before = np.cumsum(rng.exponential(1.0 / lam, int(lam * warm_s * 1.5) + 10))
            for at in (before[before < warm_s] - warm_s).tolist():
                est.observe(at)
        policy = OneShotPolicy(controller, est, lambda_z, repriced=repriced)
        result = replay_policy(arrivals, waits, policy, model.slots, model.price)
        rel.append((result.mean_cost - base.mean_cost) / base.mean_cost)
    r = np.array(rel)
    return {"mean": float(r.mean()), "sd": float(r.std()), "se": float(r.std() / np.sqrt(reps))}


def _pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tenure.service.replay.ttl_diagnose")
    parser.add_argument("--family", default="mixture", choices=sorted(SYNTHETIC_FAMILIES))
    parser.add_argument("--load", type=float, default=2.0, help="multiple of lambda_crit")
    parser.add_argument("--reps", type=int, default=40, help="held-out traces")
    parser.add_argument("--samples", type=int, default=100, help="calibration samples")
    parser.add_argument("--sizes", default="2000,4000,8000", help="calibration sample sizes")
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--calibration-load", type=float, default=2.0)
    parser.add_argument("--estimator", default="changepoint:300")
    parser.add_argument("--lambda-z", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--only", default="timers,calibration,lambda", help="which parts: timers,calibration,lambda"
    )
    args = parser.parse_args(argv)
    model = RetentionModel(get_platform("h100-nvl").price, 425, 1800.0)
    family = synthetic_family(args.family, model.w_ref_s)
    parts = {p.strip() for p in args.only.split(",")}
    say = sys.stdout.write
    if "timers" in parts:
        t2 = model.t2(args.load * model.lambda_crit)
        say(f"{args.family} at {args.load:g} x lambda_crit, {args.reps} paired traces of "
            f"{args.requests} contexts (t2 = {t2} s)\n")  # fmt: skip
        say(f"  {'timer':<12} {'cost':>7} {'vs 30min':>9} {'(se)':>7}  "
            f"{'host hits':>9} {'expired':>8} {'refused':>8}\n")  # fmt: skip
        for row in timer_curve(model, family, args.load, args.reps, args.requests, args.seed):
            say(f"  {row['timer']:<12} {row['cost']:7.4f} {_pct(row['vs_30min']):>9} "
                f"{row['vs_30min_se'] * 100:6.2f}%  {row['host_hits']:9.0f} "
                f"{row['expired']:8.0f} {row['refused']:8.0f}\n")  # fmt: skip
    if "calibration" in parts:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        say(f"seed calibration at {args.calibration_load:g} x lambda_crit, "
            f"{args.samples} independent samples: (ttl - retain) / retain\n")  # fmt: skip
        for row in calibration_spread(
            model, family, args.calibration_load, sizes, (1, 16), args.samples, args.seed
        ):
            say(f"  n={row['samples_n']:<5} streams={row['draws']:<3} mean {_pct(row['mean'])} "
                f"sd {row['sd'] * 100:.2f}%  picks {row['loser']} (the loser on average) in "
                f"{row['picks_the_loser']}/{row['of']}\n")  # fmt: skip
    if "lambda" in parts:
        say(f"ttl branch, t2 at the {args.estimator} estimate (z = {args.lambda_z:g}) vs t2 at "
            f"the configured lambda, {args.reps} traces\n")  # fmt: skip
        for repriced in (False, True):
            for warm in (0.0, HOUR):
                r = lambda_cost(
                    model, family, args.load, args.reps, args.requests, args.seed,
                    args.estimator, args.lambda_z, warm, repriced,
                )  # fmt: skip
                timer = "re-priced" if repriced else "one-shot"
                label = "cold (Table 6)" if warm == 0 else "warmed by 1 h of the same stream"
                say(f"  {timer:<9} {label:<34} {_pct(r['mean'])} (sd {r['sd'] * 100:.2f}%, "
                    f"se {r['se'] * 100:.2f}%)\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
