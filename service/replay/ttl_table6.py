"""Seed 002's Table 6: host-retention policies across load, per wait family, at C2 = 425.

Per cell (family x load) and replicate: one held-out trace (Poisson suspensions at
``load x lambda_crit`` with waits from the family's held-out pool) replayed under every policy
(paired: the same trace for all), and an independent calibration sample the controllers choose
their branch from. Policies:

* ``cpu_ttl``: ``t2(lambda)`` at the configured load, every context;
* ``inf`` (host-retain), ``10min``, ``30min``, ``60min``: fixed timers (the "fixed" set);
* ``controller``: the seed's one-shot controller: branch from replaying the calibration sample
  once per family at ``calibration_load`` (the seed's 2 x lambda_crit), then ``t2`` at the
  configured load;
* ``controller_est``: the same branch, lambda estimated online from the held-out suspension
  stream (cold at the start), each copy's timer re-priced by the rent clock as the estimate
  improves (:mod:`tenure.service.policy.rent`; at a constant price it is ``t2``);
* ``controller_est_oneshot``: the same, but each copy's timer fixed at ``t2`` of the estimate
  at its own suspension (the one-shot timer, for comparison);
* ``online``: the seed's two branches online from nothing: estimated lambda, waits
  re-collected from the resumes it observes, branch re-chosen periodically with hysteresis;
* ``rule``: the retention rule of issue 26 (:mod:`tenure.service.policy.retention_rule`: a
  rent-budget scale of ``t2`` from a fine grid, by expected cost over bootstrap resamples),
  calibrated once on the calibration sample at the configured load (episode score, as the seed's),
  frozen;
* ``rule_est``: the same scale, lambda estimated online, timers re-priced by the rent clock;
* ``rule_learn``: the rule calibrated, then learning: it scores the calibration sample until it
  has observed ``min_samples`` waits of its own, then its own (the sidecar's path: ``POST
  /admin/waits`` as the prior), lambda estimated, steady-state score;
* ``rule_online``: the rule online from no data (estimated lambda, steady-state score).

Gains are against the best of the seed's four fixed timers (``gain``) and of a finer grid
(:data:`FINE_TIMERS`, ``gain_fine``: what the real-gap family is judged on).

Costs are mean GPU-s per suspended context; a cell's entry is the mean over replicates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tenure.service.policy.host_loss import episode_cost
from tenure.service.policy.rate import rate_estimator
from tenure.service.policy.retention_control import (
    CalibratedTimer,
    OneShotController,
    OnlineController,
    OnlineSettings,
)
from tenure.service.policy.retention_costs import RetentionModel
from tenure.service.policy.retention_rule import timer_for_scale
from tenure.service.replay.ttl_families import WaitFamily
from tenure.service.replay.ttl_policies import OneShotPolicy, OnlinePolicy
from tenure.service.replay.ttl_sim import poisson_arrivals, replay_policy, replay_timers

__all__ = [
    "ACCEPTANCE",
    "ACCEPTANCE_FINE",
    "FINE_TIMERS",
    "FIXED_TIMERS",
    "SEED_TABLE6",
    "Table6Spec",
    "fine_costs",
    "run_table6",
    "seed_spread",
]

#: The fixed host timers of the seed (name -> seconds; ``None``: retain until resume).
FIXED_TIMERS: dict[str, float | None] = {
    "inf": None,
    "10min": 600.0,
    "30min": 1800.0,
    "60min": 3600.0,
}

#: A finer grid of fixed timers (issue 26): every 5 minutes to 2 hours, then 2.5, 3, 4 and 6
#: hours, and retain. Its best, chosen in hindsight per cell, is the bar on the real gaps.
FINE_TIMERS: dict[str, float | None] = {
    **{f"{m}min": 60.0 * m for m in range(5, 121, 5)},
    **{f"{m}min": 60.0 * m for m in (150, 180, 240, 360)},
    "inf": None,
}

#: Issue 13's acceptance per controller: the gain over the best fixed timer must not fall below
#: this in any cell of the seed's families (``None``: reported, no target).
ACCEPTANCE: dict[str, float | None] = {
    "controller": -0.005,
    "controller_est": -0.01,
    "controller_est_oneshot": None,
    "online": None,
    "rule": -0.005,
    "rule_robust": -0.005,
    "rule_est": -0.01,
    "rule_learn": None,
    "rule_online": None,
}

#: Issue 26's acceptance on the real gaps (``claude-code``), against the best of
#: :data:`FINE_TIMERS`: (mean over the base seeds at least, every base seed at least).
ACCEPTANCE_FINE: dict[str, tuple[float, float]] = {
    "rule": (-0.01, -0.02),
    "rule_robust": (-0.01, -0.02),
    "rule_learn": (-0.01, -0.02),
    "rule_online": (-0.01, -0.02),
}

#: Seed 002, Table 6 as printed (GPU-s per request), for the side-by-side comparison.
SEED_TABLE6: dict[str, dict[float, dict[str, Any]]] = {
    "lognormal": {
        0.5: {"cpu_ttl": 0.020, "inf": 0.020, "10min": 1.374, "30min": 0.598, "60min": 0.243,
              "controller": 0.020, "branch": "retain"},
        1.0: {"cpu_ttl": 0.065, "inf": 0.065, "10min": 1.374, "30min": 0.598, "60min": 0.243,
              "controller": 0.065, "branch": "retain"},
        2.0: {"cpu_ttl": 0.851, "inf": 0.787, "10min": 1.374, "30min": 0.868, "60min": 0.834,
              "controller": 0.787, "branch": "retain"},
        3.0: {"cpu_ttl": 1.239, "inf": 1.081, "10min": 1.375, "30min": 1.199, "60min": 1.138,
              "controller": 1.081, "branch": "retain"},
    },
    "exponential": {
        0.5: {"cpu_ttl": 0.020, "inf": 0.020, "10min": 1.373, "30min": 0.737, "60min": 0.278,
              "controller": 0.020, "branch": "retain"},
        1.0: {"cpu_ttl": 0.132, "inf": 0.132, "10min": 1.373, "30min": 0.737, "60min": 0.278,
              "controller": 0.132, "branch": "retain"},
        2.0: {"cpu_ttl": 0.993, "inf": 0.877, "10min": 1.373, "30min": 0.999, "60min": 0.937,
              "controller": 0.877, "branch": "retain"},
        3.0: {"cpu_ttl": 1.307, "inf": 1.145, "10min": 1.373, "30min": 1.266, "60min": 1.229,
              "controller": 1.145, "branch": "retain"},
    },
    "mixture": {
        0.5: {"cpu_ttl": 0.020, "inf": 0.020, "10min": 0.957, "30min": 0.728, "60min": 0.363,
              "controller": 0.020, "branch": "ttl"},
        1.0: {"cpu_ttl": 0.072, "inf": 0.072, "10min": 0.957, "30min": 0.728, "60min": 0.363,
              "controller": 0.072, "branch": "ttl"},
        2.0: {"cpu_ttl": 0.759, "inf": 0.785, "10min": 0.957, "30min": 0.758, "60min": 0.789,
              "controller": 0.759, "branch": "ttl"},
        3.0: {"cpu_ttl": 0.923, "inf": 1.073, "10min": 0.957, "30min": 1.082, "60min": 1.126,
              "controller": 0.923, "branch": "ttl"},
    },
}  # fmt: skip


@dataclass(frozen=True)
class Table6Spec:
    model: RetentionModel
    families: Sequence[WaitFamily]
    loads: Sequence[float] = (0.5, 1.0, 2.0, 3.0)
    requests: int = 4000
    calibration_samples: int = 4000
    calibration_load: float = 2.0
    replicates: int = 5
    seed: int = 0
    online: OnlineSettings = field(default_factory=OnlineSettings)
    #: The estimator ``controller_est`` uses (the online controller's, by default).
    estimator: str | None = None
    #: Bootstrap resamples of the calibrated rule's episode score.
    rule_resamples: int = 8


def _fixed_costs(
    spec: Table6Spec, arrivals: np.ndarray, waits: np.ndarray, lam: float
) -> dict[str, float]:
    n = len(arrivals)
    out: dict[str, float] = {}
    t2 = spec.model.t2(lam)
    timers: dict[str, float | None] = {"cpu_ttl": t2, **FIXED_TIMERS}
    for name, ttl in timers.items():
        ttls = np.full(n, np.inf if ttl is None else ttl)
        out[name] = replay_timers(
            arrivals, waits, ttls, spec.model.slots, spec.model.price
        ).mean_cost
    return out


def fine_costs(model: RetentionModel, arrivals: np.ndarray, waits: np.ndarray) -> dict[str, float]:
    """Mean GPU-s per suspended context of every :data:`FINE_TIMERS` timer on one episode."""
    at, w = arrivals.tolist(), waits.tolist()
    return {
        name: episode_cost(at, w, ttl, model.slots, model.price).cost
        for name, ttl in FINE_TIMERS.items()
    }


def _cell_replicate(
    spec: Table6Spec, family: WaitFamily, f_idx: int, l_idx: int, load: float, rep: int
) -> tuple[dict[str, float], dict[str, Any]]:
    model = spec.model
    lam = load * model.lambda_crit
    held = np.random.default_rng([spec.seed, 1, f_idx, l_idx, rep])
    arrivals = poisson_arrivals(spec.requests, lam, held)
    waits = family.sample(spec.requests, held, "heldout")
    # Calibrated once per family and replicate (not per load), as the seed does.
    calib = np.random.default_rng([spec.seed, 2, f_idx, rep])
    calibration = family.sample(spec.calibration_samples, calib, "calibration").tolist()
    costs = _fixed_costs(spec, arrivals, waits, lam)
    oneshot = OneShotController(
        model,
        lam=lam,
        calibration_waits_s=calibration,
        calibration_lam=spec.calibration_load * model.lambda_crit,
        evaluator="episode",
        seed=rep,
    )
    ttl_now = oneshot.host_ttl()
    ttls = np.full(len(arrivals), np.inf if ttl_now is None else ttl_now)
    costs["controller"] = replay_timers(arrivals, waits, ttls, model.slots, model.price).mean_cost
    estimator_spec = spec.estimator or spec.online.estimator
    estimator = rate_estimator(estimator_spec)
    repriced = spec.online.timer == "repriced"
    est_policy = OneShotPolicy(oneshot, estimator, spec.online.lambda_z, repriced=repriced)
    est = replay_policy(arrivals, waits, est_policy, model.slots, model.price)
    costs["controller_est"] = est.mean_cost
    fixed_policy = OneShotPolicy(oneshot, rate_estimator(estimator_spec), spec.online.lambda_z)
    costs["controller_est_oneshot"] = replay_policy(
        arrivals, waits, fixed_policy, model.slots, model.price
    ).mean_cost
    online_policy = OnlinePolicy(OnlineController(model, spec.online))
    online = replay_policy(arrivals, waits, online_policy, model.slots, model.price)
    costs["online"] = online.mean_cost
    # The retention rule (issue 26), calibrated at this load, then est-lam / learning / online.
    rule = CalibratedTimer(
        model, lam=lam, calibration_waits_s=calibration, evaluator="episode",
        resamples=spec.rule_resamples, seed=rep,
    )  # fmt: skip
    ttl_rule = rule.host_ttl()
    ttls = np.full(len(arrivals), np.inf if ttl_rule is None else ttl_rule)
    costs["rule"] = replay_timers(arrivals, waits, ttls, model.slots, model.price).mean_cost
    # The same sample and resamples, the candidate of least worst-case regret (issue 26,
    # session 3: between retain and a timer the regime flips on small sample differences).
    robust_scale = rule.choice.regret_scale
    ttl_robust = timer_for_scale(model, robust_scale, lam)
    ttls = np.full(len(arrivals), np.inf if ttl_robust is None else ttl_robust)
    costs["rule_robust"] = replay_timers(arrivals, waits, ttls, model.slots, model.price).mean_cost
    rule_est = OneShotPolicy(
        rule, rate_estimator(estimator_spec), spec.online.lambda_z, repriced=repriced
    )
    costs["rule_est"] = replay_policy(arrivals, waits, rule_est, model.slots, model.price).mean_cost
    # The rule starts at the seed's break-even timer (scale 1, as the sidecar does): a copy
    # retained before the first decision holds its slot for its whole wait, which on a
    # heavy tail blocks the tier for hours (measured: claude-code 3 x, -41% from retain).
    # Scored over the episode's own span (its end, requests / lambda, is the benchmark's: the
    # objective this replay scores; a deployment has none, and scores the long run).
    rule_settings = replace(
        spec.online, rule="timer", initial_branch="ttl", horizon_s=spec.requests / lam
    )
    learn = OnlinePolicy(OnlineController(model, rule_settings, prior_waits_s=tuple(calibration)))
    costs["rule_learn"] = replay_policy(arrivals, waits, learn, model.slots, model.price).mean_cost
    fresh = OnlinePolicy(OnlineController(model, rule_settings))
    costs["rule_online"] = replay_policy(arrivals, waits, fresh, model.slots, model.price).mean_cost
    fine = fine_costs(spec.model, arrivals, waits)
    costs.update({f"fine:{k}": v for k, v in fine.items()})
    lam_est = np.array([lam_i for _at, lam_i in est_policy.lam_errors])
    info = {
        "branch": oneshot.branch,
        "lam_est_mean_rel_err": float(np.mean(np.abs(lam_est - lam)) / lam),
        "online_final_branch": online_policy.controller.branch,
        "online_switches": online_policy.controller.switches,
        "rule_scale": rule.scale,
        "rule_robust_scale": robust_scale,
        "rule_learn_scale": learn.controller.scale,
        "rule_online_scale": fresh.controller.scale,
    }
    return costs, info


def run_table6(
    spec: Table6Spec, progress: Callable[[int, int], None] | None = None
) -> list[dict[str, Any]]:
    """The cells, in family-then-load order, in the JSON shape of ``tenure replay ttl``."""
    cells: list[dict[str, Any]] = []
    total = len(spec.families) * len(spec.loads) * spec.replicates
    done = 0
    for f_idx, family in enumerate(spec.families):
        for l_idx, load in enumerate(spec.loads):
            per_rep: list[dict[str, float]] = []
            infos: list[dict[str, Any]] = []
            for rep in range(spec.replicates):
                costs, info = _cell_replicate(spec, family, f_idx, l_idx, load, rep)
                per_rep.append(costs)
                infos.append(info)
                done += 1
                if progress is not None:
                    progress(done, total)
            cells.append(_cell(family.name, load, per_rep, infos))
    return cells


def _gain(best: float, cost: float) -> float:
    """Relative gain over ``best`` (positive favours ``cost``'s policy), as the seed's."""
    return (best - cost) / best if best > 0 else 0.0


def _cell(
    family: str, load: float, per_rep: list[dict[str, float]], infos: list[dict[str, Any]]
) -> dict[str, Any]:
    names = list(per_rep[0])
    costs = {name: float(np.mean([r[name] for r in per_rep])) for name in names}
    sds = {name: float(np.std([r[name] for r in per_rep])) for name in names}
    best_name = min(FIXED_TIMERS, key=lambda n: costs[n])
    best = costs[best_name]
    branches = sorted({i["branch"] for i in infos})

    fine_names = [n for n in names if n.startswith("fine:")]
    best_fine_name = min(fine_names, key=lambda n: costs[n]) if fine_names else best_name
    best_fine = costs[best_fine_name]

    def rep_gains(policy: str) -> list[float]:
        return [_gain(min(r[n] for n in FIXED_TIMERS), r[policy]) for r in per_rep]

    cell: dict[str, Any] = {
        "family": family,
        "load": load,
        "controller_branch": branches[0] if len(branches) == 1 else "/".join(branches),
        "controller_cost": costs["controller"],
        "best_fixed_name": best_name,
        "best_fixed_cost": best,
        "costs": costs,
        "cost_sd": sds,
        "gain": {p: _gain(best, costs[p]) for p in ACCEPTANCE},
        "best_fine_name": best_fine_name.removeprefix("fine:"),
        "best_fine_cost": best_fine,
        "gain_fine": {p: _gain(best_fine, costs[p]) for p in ACCEPTANCE},
        "rule_scale": [i["rule_scale"] for i in infos],
        "rule_robust_scale": [i["rule_robust_scale"] for i in infos],
        "rule_learn_scale": [i["rule_learn_scale"] for i in infos],
        "rule_online_scale": [i["rule_online_scale"] for i in infos],
        "replicate_gains": {p: rep_gains(p) for p in ACCEPTANCE},
        "replicates": len(per_rep),
        "branch_per_replicate": [i["branch"] for i in infos],
        "lam_est_mean_rel_err": float(np.mean([i["lam_est_mean_rel_err"] for i in infos])),
        "online_final_branch": [i["online_final_branch"] for i in infos],
        "online_switches": [i["online_switches"] for i in infos],
    }
    seed = SEED_TABLE6.get(family, {}).get(load)
    if seed is not None:
        cell["seed"] = seed
    return cell


def seed_spread(runs: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Each controller's gain per cell across independent base seeds (each a whole Table 6).

    A cell's gain under one base seed is itself a mean over its replicates; this is how much
    that number moves from one independent run of the table to the next, and how often it
    falls short of the acceptance (:data:`ACCEPTANCE`).
    """
    seeds = sorted(runs)
    if not seeds:
        raise ValueError("seed_spread needs at least one run")
    first = runs[seeds[0]]
    cells: list[dict[str, Any]] = []
    for i, cell in enumerate(first):
        entry: dict[str, Any] = {"family": cell["family"], "load": cell["load"]}
        for policy, target in ACCEPTANCE.items():
            gains = np.array([float(runs[s][i]["gain"][policy]) for s in seeds])
            entry[policy] = {
                "mean": float(gains.mean()),
                "sd": float(gains.std()),
                "min": float(gains.min()),
                "max": float(gains.max()),
                "per_seed": gains.tolist(),
                "short_of_target": None if target is None else int((gains < target).sum()),
            }
            fine = np.array([float(runs[s][i]["gain_fine"][policy]) for s in seeds])
            entry[policy]["fine"] = {
                "mean": float(fine.mean()),
                "sd": float(fine.std()),
                "min": float(fine.min()),
                "max": float(fine.max()),
                "per_seed": fine.tolist(),
            }
        entry["wrong_branch_replicates"] = sum(
            runs[s][i]["branch_per_replicate"].count(_other(runs[s][i])) for s in seeds
        )
        cells.append(entry)
    return {"seeds": seeds, "acceptance": dict(ACCEPTANCE), "cells": cells}


def _other(cell: Mapping[str, Any]) -> str:
    """The branch the seed's table does not name for this family (a wrong calibration)."""
    seed = SEED_TABLE6.get(str(cell["family"]), {}).get(float(cell["load"]))
    if seed is None:
        return "-"  # no seed row: nothing to count as wrong
    return "ttl" if seed["branch"] == "retain" else "retain"
