"""A non-stationary day: load ramps and the wait family switches (beyond the seed).

The default day (multiples of ``lambda_crit``; the wait family of a context is the one in force
when it suspends):

=========  ==============  ==========  ==================
phase      hours           load        waits
=========  ==============  ==========  ==================
calm       0 - 6           0.5         lognormal
peak-ln    6 - 11          0.5 -> 3    lognormal (ramp over the first hour)
peak-mix   11 - 15         3           mixture
evening    15 - 24         3 -> 1      mixture (ramp over the first hour)
=========  ==============  ==========  ==================

Compared on the same suspensions (paired): every fixed timer all day; the seed's one-shot
controller (lambda configured to the day's mean load, one calibration sample of the morning's
family, branch frozen); Tenure's online controller (starting from the same calibration sample,
then lambda estimated from the suspensions and waits re-collected from the resumes), once per
rate estimator under comparison; ``cpu_ttl`` at the true instantaneous load (an oracle of the
load, not of the waits); and the hindsight best fixed timer per phase (every combination of
the fixed timers over the phases, replayed as one day, the cheapest kept).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tenure.service.policy.rate import rate_estimator
from tenure.service.policy.retention_control import (
    OneShotController,
    OnlineController,
    OnlineSettings,
)
from tenure.service.policy.retention_costs import Evaluator, RetentionModel
from tenure.service.policy.waits import WaitWindow
from tenure.service.replay.ttl_families import WaitFamily
from tenure.service.replay.ttl_policies import LoadIndexedTimer, OnlinePolicy
from tenure.service.replay.ttl_sim import replay_policy, replay_timers, thinned_arrivals
from tenure.service.replay.ttl_table6 import FIXED_TIMERS

__all__ = ["DEFAULT_ESTIMATORS", "DriftPhase", "DriftSpec", "default_phases", "run_drift"]

HOUR = 3600.0

#: The rate estimators the drift run compares (the first is the online controller's default).
DEFAULT_ESTIMATORS = (
    "changepoint:300",
    "window:300",
    "window:900",
    "window:1800",
    "decay:300",
    "decay:900",
)


@dataclass(frozen=True)
class DriftPhase:
    """``[start_h, end_h)``: load ramps linearly from ``load_from`` to ``load`` over
    ``ramp_h`` hours, then holds; waits from ``family``."""

    name: str
    start_h: float
    end_h: float
    load_from: float
    load: float
    family: str
    ramp_h: float = 0.0

    def load_at(self, hour: float) -> float:
        if self.ramp_h > 0 and hour < self.start_h + self.ramp_h:
            frac = (hour - self.start_h) / self.ramp_h
            return self.load_from + (self.load - self.load_from) * frac
        return self.load


def default_phases() -> tuple[DriftPhase, ...]:
    return (
        DriftPhase("calm", 0, 6, 0.5, 0.5, "lognormal"),
        DriftPhase("peak-ln", 6, 11, 0.5, 3.0, "lognormal", ramp_h=1),
        DriftPhase("peak-mix", 11, 15, 3.0, 3.0, "mixture"),
        DriftPhase("evening", 15, 24, 3.0, 1.0, "mixture", ramp_h=1),
    )


@dataclass(frozen=True)
class DriftSpec:
    model: RetentionModel
    families: dict[str, WaitFamily]
    phases: tuple[DriftPhase, ...] = field(default_factory=default_phases)
    estimators: Sequence[str] = DEFAULT_ESTIMATORS
    online: OnlineSettings = field(default_factory=OnlineSettings)
    calibration_samples: int = 4000
    replicates: int = 3
    seed: int = 0
    #: Also run the online controller with the other branch evaluator and without censoring.
    ablations: bool = True

    def phase_at(self, hour: float) -> int:
        for i, phase in enumerate(self.phases):
            if phase.start_h <= hour < phase.end_h:
                return i
        return len(self.phases) - 1

    def load_at(self, t_s: float) -> float:
        hour = t_s / HOUR
        return self.phases[self.phase_at(hour)].load_at(hour)

    @property
    def horizon_s(self) -> float:
        return self.phases[-1].end_h * HOUR

    def mean_load(self) -> float:
        grid = np.linspace(0.0, self.horizon_s, 24 * 60 * 4, endpoint=False)
        return float(np.mean([self.load_at(t) for t in grid]))


@dataclass
class _Day:
    arrivals: np.ndarray
    waits: np.ndarray
    phase: np.ndarray
    calibration: list[float]


def _day(spec: DriftSpec, rep: int) -> _Day:
    crit = spec.model.lambda_crit
    rng = np.random.default_rng([spec.seed, 3, rep])
    peak = max(max(p.load, p.load_from) for p in spec.phases) * crit
    arrivals = thinned_arrivals(lambda t: spec.load_at(t) * crit, peak, spec.horizon_s, rng)
    phase = np.array([spec.phase_at(t / HOUR) for t in arrivals.tolist()], dtype=int)
    waits = np.empty(len(arrivals))
    for i, p in enumerate(spec.phases):
        mask = phase == i
        waits[mask] = spec.families[p.family].sample(int(mask.sum()), rng, "heldout")
    calib_rng = np.random.default_rng([spec.seed, 4, rep])
    first = spec.families[spec.phases[0].family]
    calibration = first.sample(spec.calibration_samples, calib_rng, "calibration").tolist()
    return _Day(arrivals, waits, phase, calibration)


def _timers(day: _Day, per_phase: Sequence[float | None]) -> np.ndarray:
    table = np.array([np.inf if t is None else t for t in per_phase])
    timers: np.ndarray = table[day.phase]
    return timers


def _online(spec: DriftSpec, day: _Day, settings: OnlineSettings) -> tuple[float, dict[str, Any]]:
    model = spec.model
    controller = OnlineController(
        model,
        settings,
        waits=WaitWindow(settings.window, day.calibration[-settings.window :]),
    )
    policy = OnlinePolicy(controller)
    result = replay_policy(day.arrivals, day.waits, policy, model.slots, model.price)
    crit = model.lambda_crit
    lam = np.array([lam for _at, lam in policy.lam_trace])
    true = np.array([spec.load_at(at) * crit for at, _lam in policy.lam_trace])
    info = {
        "lambda_mean_abs_rel_err": float(np.mean(np.abs(lam - true) / true)),
        "switches": controller.switches,
        "decisions": len(policy.decisions),
        "branch_timeline": [
            {"at_h": d.at / HOUR, "branch": d.branch, "lam_x_crit": d.lam / crit}
            for d in policy.decisions
            if d.changed
        ],
        "phase_costs": _phase_costs(spec, day, result.costs),
        "sample_decisions": [
            d.reason for d in policy.decisions[:: max(1, len(policy.decisions) // 8)]
        ],
    }
    return result.mean_cost, info


def _phase_costs(spec: DriftSpec, day: _Day, costs: np.ndarray) -> dict[str, float]:
    return {
        p.name: float(costs[day.phase == i].mean()) if np.any(day.phase == i) else 0.0
        for i, p in enumerate(spec.phases)
    }


def _hindsight(spec: DriftSpec, day: _Day) -> tuple[float, dict[str, str]]:
    model = spec.model
    names = list(FIXED_TIMERS)
    best_cost, best_combo = float("inf"), tuple(names[:1] * len(spec.phases))
    for combo in itertools.product(names, repeat=len(spec.phases)):
        ttls = _timers(day, [FIXED_TIMERS[n] for n in combo])
        cost = replay_timers(day.arrivals, day.waits, ttls, model.slots, model.price).mean_cost
        if cost < best_cost:
            best_cost, best_combo = cost, combo
    return best_cost, {p.name: n for p, n in zip(spec.phases, best_combo, strict=True)}


def _replicate(spec: DriftSpec, rep: int) -> dict[str, Any]:
    model = spec.model
    day = _day(spec, rep)
    out: dict[str, Any] = {"requests": len(day.arrivals)}
    fixed: dict[str, float] = {}
    fixed_phase: dict[str, dict[str, float]] = {}
    for name, ttl in FIXED_TIMERS.items():
        res = replay_timers(
            day.arrivals,
            day.waits,
            _timers(day, [ttl] * len(spec.phases)),
            model.slots,
            model.price,
        )
        fixed[name] = res.mean_cost
        fixed_phase[name] = _phase_costs(spec, day, res.costs)
    out["fixed"] = fixed
    out["fixed_phase_costs"] = fixed_phase
    configured = spec.mean_load() * model.lambda_crit
    oneshot = OneShotController(
        model, lam=configured, calibration_waits_s=day.calibration, evaluator="episode", seed=rep
    )
    ttl = oneshot.host_ttl()
    res = replay_timers(
        day.arrivals, day.waits, _timers(day, [ttl] * len(spec.phases)), model.slots, model.price
    )
    out["oneshot"] = res.mean_cost
    out["oneshot_branch"] = oneshot.branch
    out["oneshot_phase_costs"] = _phase_costs(spec, day, res.costs)
    true_timer = LoadIndexedTimer(model, lambda t: spec.load_at(t) * model.lambda_crit)
    out["cpu_ttl_true_load"] = replay_policy(
        day.arrivals, day.waits, true_timer, model.slots, model.price
    ).mean_cost
    out["hindsight"], out["hindsight_choice"] = _hindsight(spec, day)
    online: dict[str, Any] = {}
    variants: list[tuple[str, OnlineSettings]] = [
        (est, replace(spec.online, estimator=est)) for est in spec.estimators
    ]
    if spec.ablations:
        base = replace(spec.online, estimator=spec.estimators[0])
        other: Evaluator = "episode" if base.evaluator == "steady" else "steady"
        variants += [
            (f"{base.estimator} evaluator={other}", replace(base, evaluator=other)),
            (f"{base.estimator} uncensored", replace(base, censored=False)),
            (f"{base.estimator} lambda_z=0", replace(base, lambda_z=0.0)),
            (f"{base.estimator} one-shot timers", replace(base, timer="oneshot")),
        ]
        variants += [
            (f"{base.estimator} margin={m:g}", replace(base, margin=m))
            for m in (0.0, 0.02, 0.05, 0.10)
            if m != base.margin
        ]
    for label, settings in variants:
        cost, info = _online(spec, day, settings)
        online[label] = {"cost": cost, **info}
    out["online"] = online
    return out


def run_drift(
    spec: DriftSpec, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """The drift JSON section: means over replicates, with per-replicate detail."""
    for p in spec.phases:
        rate_estimator(spec.online.estimator)
        if p.family not in spec.families:
            raise ValueError(f"phase {p.name!r}: no wait family {p.family!r}")
    reps: list[dict[str, Any]] = []
    for rep in range(spec.replicates):
        reps.append(_replicate(spec, rep))
        if progress is not None:
            progress(rep + 1, spec.replicates)

    def mean(key: Callable[[dict[str, Any]], float]) -> float:
        return float(np.mean([key(r) for r in reps]))

    def online_mean(label: str, key: str) -> float:
        return float(np.mean([r["online"][label][key] for r in reps]))

    estimators = {
        label: {
            "cost": online_mean(label, "cost"),
            "lambda_mean_abs_rel_err": online_mean(label, "lambda_mean_abs_rel_err"),
            "switches": [r["online"][label]["switches"] for r in reps],
        }
        for label in reps[0]["online"]
    }
    primary = spec.estimators[0]
    online_cost = online_mean(primary, "cost")
    hindsight = mean(lambda r: float(r["hindsight"]))
    oneshot = mean(lambda r: float(r["oneshot"]))
    fixed = {name: float(np.mean([r["fixed"][name] for r in reps])) for name in FIXED_TIMERS}
    return {
        "online_cost": online_cost,
        "oneshot_cost": oneshot,
        "hindsight_cost": hindsight,
        "fixed": fixed,
        "online_estimator": primary,
        "online_vs_hindsight": (online_cost - hindsight) / hindsight,
        "online_vs_oneshot": (online_cost - oneshot) / oneshot,
        "cpu_ttl_true_load": mean(lambda r: float(r["cpu_ttl_true_load"])),
        "estimators": estimators,
        "oneshot_branch": [r["oneshot_branch"] for r in reps],
        "hindsight_choice": [r["hindsight_choice"] for r in reps],
        "configured_lambda_x_crit": spec.mean_load(),
        "phases": [
            {
                "name": p.name,
                "hours": [p.start_h, p.end_h],
                "load": [p.load_from, p.load],
                "family": p.family,
            }
            for p in spec.phases
        ],
        "replicates": reps,
    }
