"""``tenure replay placement``: SSD-tier lifetime under every placement, per DRAM/SSD split.

For each capacity split (host DRAM GiB over one SSD), every contender (the lifecycle-blind
baselines and Lachesis with and without the ranker, as enforced on write-through tiering, and
with Tenure's gate as the DRAM policy) is replayed at every arrival rate of a grid. The latency
SLO is a multiple of the *unloaded* p95 turn latency (write-through at a low reference rate, per
split); the load a contender's SLO admits is the highest grid rate at which its p95 JCT meets it,
and its projected device-years are the SSD's rated endurance over the write rate it sustains at
that load (24x7). Everything is deterministic per seed; runs go through
:func:`~tenure.service.replay.experiment.run_grid` (parallel processes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tenure.service.policy.ranker import HeuristicRanker, RidgeRanker
from tenure.service.policy.ranker_fit import LabeledSpawn, cross_validate
from tenure.service.replay.config import ReplayConfig, TieringConfig, WorkloadNotes
from tenure.service.replay.experiment import run_grid
from tenure.service.replay.hardware import GIB, HardwareProfile, SsdProfile
from tenure.service.replay.loaders.claude_code_meta import TraceMeta
from tenure.service.replay.model import Trace
from tenure.service.replay.reasoning import ReasoningEstimate
from tenure.service.replay.results import RunResult

__all__ = [
    "BASELINES",
    "CONTENDERS",
    "Contender",
    "PlacementSpec",
    "Split",
    "placement_sessions",
    "run_placement",
]


@dataclass(frozen=True, slots=True)
class Split:
    dram_gib: float
    ssd: SsdProfile
    ssd_bytes: float | None = None

    @property
    def name(self) -> str:
        tb = (self.ssd.capacity_bytes if self.ssd_bytes is None else self.ssd_bytes) / 1e12
        return f"dram{self.dram_gib:g}g-ssd{tb:g}t"


@dataclass(frozen=True, slots=True)
class Contender:
    name: str
    placement: str
    dram_policy: str = "lru"
    #: ``ridge`` / ``ridge-extended`` (cross-fitted predictions on the base / extended spawn
    #: features), ``heuristic``, ``artefact`` or ``none``.
    ranker: str = "none"


CONTENDERS: tuple[Contender, ...] = (
    Contender("write-through", "write-through"),
    Contender("dram-first", "dram-first"),
    Contender("frequency-filter", "frequency-filter"),
    Contender("store-threshold", "store-threshold"),
    Contender("lachesis", "lachesis", ranker="ridge-extended"),
    Contender("lachesis-heuristic", "lachesis", ranker="heuristic"),
    Contender("lachesis-no-ranker", "lachesis-no-ranker"),
    Contender("lachesis-wt", "lachesis-wt", ranker="ridge-extended"),
    Contender("lachesis+gate", "lachesis", dram_policy="tenure", ranker="ridge-extended"),
)
BASELINES = ("write-through", "dram-first", "frequency-filter", "store-threshold")
PLACEMENT = "lachesis"
HBM_FIRST = "dram-first"


@dataclass(frozen=True)
class PlacementSpec:
    hardware: HardwareProfile
    splits: tuple[Split, ...]
    rates: tuple[float, ...]
    seeds: tuple[int, ...] = (0,)
    contenders: tuple[Contender, ...] = CONTENDERS
    slo_factor: float = 2.0
    reference_rate: float = 0.0002
    fast_eviction: str = "spill"
    extra: Mapping[str, Any] = field(default_factory=dict)


def placement_sessions(trace: Trace, meta: TraceMeta, reasoning: ReasoningEstimate) -> list[int]:
    """Root sessions with a sub-agent or at least one reasoning call (the issue's subset)."""
    keep: list[int] = []
    with_children = {trace.sessions[s.parent].id for s in trace.sessions if s.parent is not None}
    for i in trace.roots:
        sid = trace.sessions[i].id
        if sid in with_children or any(reasoning.tokens.get(sid, ())):
            keep.append(i)
    return keep


def ranker_predictions(
    spawns: Sequence[LabeledSpawn], kind: str, artefact: RidgeRanker | None = None
) -> tuple[dict[str, float], dict[str, Any]]:
    """Predicted lifetime per worker session, and a description of where it came from.

    ``ridge`` uses *cross-fitted* predictions: each session's workers are scored by the model
    trained on the other folds (the same folds as the printed evaluation), so the replay never
    ranks a worker with a model that saw it.
    """
    if kind == "none":
        return {}, {"ranker": "none"}
    if kind == "heuristic":
        h = HeuristicRanker()
        return {s.worker: h.predict_lifetime_s(s.record) for s in spawns}, {"ranker": h.name}
    if kind == "artefact":
        if artefact is None:
            raise ValueError("ranker 'artefact' needs a loaded artefact")
        return {s.worker: artefact.predict_lifetime_s(s.record) for s in spawns}, {
            "ranker": "artefact (in-sample if trained on this trace)"
        }
    if kind in ("ridge", "ridge-extended"):
        cv = cross_validate(spawns)
        field = "ridge_log_lifetime" if kind == "ridge" else "ridge_extended_log_lifetime"
        preds = {w: math.exp(v[field]) for w, v in cv["oof_predictions"].items()}
        return preds, {"ranker": f"{kind} (cross-fitted, session-grouped 5-fold)"}
    raise ValueError(f"unknown ranker kind {kind!r}")


def _mean_flat(tiers: Sequence[Mapping[str, Any]], key: str) -> dict[str, float]:
    keys = sorted({k for t in tiers for k in t.get(key, {})})
    return {k: float(sum(t.get(key, {}).get(k, 0) for t in tiers) / len(tiers)) for k in keys}


def _mean_nested(tiers: Sequence[Mapping[str, Any]], key: str) -> dict[str, dict[str, float]]:
    outer = sorted({k for t in tiers for k in t.get(key, {})})
    return {k: _mean_flat([t.get(key, {}) for t in tiers], k) for k in outer}


def _summary(runs: Sequence[RunResult], bt: int) -> dict[str, Any]:
    jct = np.concatenate([np.frombuffer(r.jct_s, dtype=np.float64) for r in runs])
    reusable = sum(sum(r.reusable_tokens) for r in runs)
    hit = sum(sum(r.host_hit_tokens) for r in runs)
    ssd_hit = sum(r.tiering["ssd_hit_blocks"] for r in runs) * bt
    tiers = [r.tiering for r in runs]

    def mean(key: str) -> float:
        return float(sum(t[key] for t in tiers) / len(tiers))

    classes = sorted({c for t in tiers for c in t["ssd_write_bytes"]})
    return {
        "p95_jct_s": float(np.percentile(jct, 95)) if jct.size else math.nan,
        "p50_jct_s": float(np.percentile(jct, 50)) if jct.size else math.nan,
        "hit_rate": hit / reusable if reusable else 0.0,
        "dram_hit_rate": (hit - ssd_hit) / reusable if reusable else 0.0,
        "ssd_hit_rate": ssd_hit / reusable if reusable else 0.0,
        "ssd_write_bytes_total": mean("ssd_write_bytes_total"),
        "dram_write_bytes_total": mean("dram_write_bytes_total"),
        "ssd_write_bytes": {
            c: float(sum(t["ssd_write_bytes"].get(c, 0) for t in tiers) / len(tiers))
            for c in classes
        },
        "ssd_write_bytes_by_cause": _mean_nested(tiers, "ssd_write_bytes_by_cause"),
        "ssd_rewritten_bytes": _mean_flat(tiers, "ssd_rewritten_bytes"),
        "ssd_read_back_bytes": _mean_flat(tiers, "ssd_read_back_bytes"),
        "fast_write_share": mean("fast_write_share"),
        "fast_store_share": mean("fast_store_share"),
        "materialized_bytes": _mean_flat(tiers, "materialized_bytes"),
        "ssd_write_rate_bytes_per_s": mean("ssd_write_rate_bytes_per_s"),
        "device_years": mean("device_years"),
        "ssd_write_utilisation": mean("ssd_write_utilisation"),
        "ssd_peak_used_bytes": mean("ssd_peak_used_bytes"),
        "leaked_segments": max(t["leaked_segments"] for t in tiers),
        "ssd_used_bytes_at_end": mean("ssd_used_bytes_at_end"),
        "counters": {
            k: float(sum(t["counters"].get(k, 0) for t in tiers) / len(tiers))
            for k in sorted({k for t in tiers for k in t["counters"]})
        },
        "turns": int(jct.size),
        "sessions_skipped_oversize": runs[0].sessions_skipped_oversize,
    }


def _config(
    spec: PlacementSpec,
    split: Split,
    contender: Contender,
    rate: float,
    seed: int,
    notes: Mapping[str, WorkloadNotes],
) -> ReplayConfig:
    tiering = TieringConfig(
        contender.placement,
        split.ssd,
        notes[contender.ranker],
        split.ssd_bytes,
        spec.fast_eviction,
    )
    return ReplayConfig(
        contender.dram_policy, spec.hardware, split.dram_gib, rate, seed, tiering=tiering
    )


def run_placement(
    trace: Trace,
    spec: PlacementSpec,
    reasoning: ReasoningEstimate,
    spawns: Sequence[LabeledSpawn],
    jobs: int,
    artefact: RidgeRanker | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Every run of the experiment, assembled into the JSON the CLI writes."""
    kinds = sorted({c.ranker for c in spec.contenders} | {"none"})
    notes: dict[str, WorkloadNotes] = {}
    ranker_info: dict[str, Any] = {}
    for kind in kinds:
        preds, info = ranker_predictions(spawns, kind, artefact)
        notes[kind] = WorkloadNotes(reasoning.tokens, preds, {}, info["ranker"])
        ranker_info[kind] = info
    reference = Contender("write-through", "write-through")
    configs: list[ReplayConfig] = []
    index: list[tuple[int, str, float, int]] = []  # (split, contender, rate, seed)
    for si, split in enumerate(spec.splits):
        for seed in spec.seeds:
            configs.append(_config(spec, split, reference, spec.reference_rate, seed, notes))
            index.append((si, "__reference__", spec.reference_rate, seed))
        for contender in spec.contenders:
            for rate in spec.rates:
                for seed in spec.seeds:
                    configs.append(_config(spec, split, contender, rate, seed, notes))
                    index.append((si, contender.name, rate, seed))
    runs = run_grid(trace, configs, jobs, on_progress)
    grouped: dict[tuple[int, str, float], list[RunResult]] = {}
    for (si, name, rate, _seed), run in zip(index, runs, strict=True):
        grouped.setdefault((si, name, rate), []).append(run)
    bt = trace.block_tokens
    out_configs = []
    for si, split in enumerate(spec.splits):
        ref = _summary(grouped[(si, "__reference__", spec.reference_rate)], bt)
        slo = spec.slo_factor * ref["p95_jct_s"]
        per_rate: dict[str, dict[float, dict[str, Any]]] = {}
        for contender in spec.contenders:
            per_rate[contender.name] = {
                rate: _summary(grouped[(si, contender.name, rate)], bt) for rate in spec.rates
            }
        out_configs.append(_assemble(split, spec, slo, ref, per_rate))
    return {
        "config": {
            **spec.extra,
            "hardware": spec.hardware.name,
            "splits": [s.name for s in spec.splits],
            "rates": list(spec.rates),
            "seeds": list(spec.seeds),
            "slo_factor": spec.slo_factor,
            "reference_rate": spec.reference_rate,
            "fast_eviction": spec.fast_eviction,
            "contenders": [
                {
                    "name": c.name,
                    "placement": c.placement,
                    "dram_policy": c.dram_policy,
                    "ranker": ranker_info[c.ranker]["ranker"],
                }
                for c in spec.contenders
            ],
            "placement": PLACEMENT,
            "hbm_first": HBM_FIRST,
            "device_years_method": "rated endurance (DWPD x capacity x 365 x warranty years) "
            "over the SSD write rate (bytes written / replay span) at the highest grid rate "
            "whose pooled p95 turn JCT meets the SLO, 24x7",
        },
        "reasoning": reasoning.summary(),
        "configs": out_configs,
    }


def _admitted(rows: Mapping[float, Mapping[str, Any]], slo: float) -> tuple[float, bool]:
    ok = [rate for rate, row in rows.items() if row["p95_jct_s"] <= slo]
    if ok:
        return max(ok), True
    return min(rows), False


def _assemble(
    split: Split,
    spec: PlacementSpec,
    slo: float,
    ref: Mapping[str, Any],
    per_rate: Mapping[str, Mapping[float, Mapping[str, Any]]],
) -> dict[str, Any]:
    """One split's entry: device-years at each contender's admitted load, hit rate and p95 at
    one common load (the placement's admitted rate), and the acceptance checks."""
    at: dict[str, Mapping[str, Any]] = {}
    admitted: dict[str, float] = {}
    slo_met: dict[str, bool] = {}
    for name, rows in per_rate.items():
        rate, met = _admitted(rows, slo)
        admitted[name] = rate
        slo_met[name] = met
        at[name] = rows[rate]
    common = admitted.get(PLACEMENT, max(spec.rates))
    same = {name: rows[common] for name, rows in per_rate.items()}
    dy = {n: row["device_years"] for n, row in at.items()}
    place = dy.get(PLACEMENT, math.nan)
    first = dy.get(HBM_FIRST, math.nan)
    freq = dy.get("frequency-filter", math.nan)
    base = [b for b in BASELINES if b in same]
    best_hit = max((same[b]["hit_rate"] for b in base), default=math.nan)
    best_p95 = min((same[b]["p95_jct_s"] for b in base), default=math.nan)
    checks: dict[str, Any] = {}
    if PLACEMENT in same and base:
        row = same[PLACEMENT]
        checks = {
            "beats_dram_first": bool(place > first),
            "ratio_at_least_1_5": bool(place >= 1.5 * first),
            "beats_frequency_filter": bool(place > freq),
            "hit_within_2pct_of_best_baseline": bool(row["hit_rate"] >= 0.98 * best_hit),
            "p95_within_2pct_of_best_baseline": bool(row["p95_jct_s"] <= 1.02 * best_p95),
            "best_baseline_hit_rate": best_hit,
            "best_baseline_p95_jct_s": best_p95,
        }
    return {
        "name": split.name,
        "dram_gib": split.dram_gib,
        "dram_bytes": split.dram_gib * GIB,
        "ssd": split.ssd.name,
        "ssd_bytes": split.ssd.capacity_bytes if split.ssd_bytes is None else split.ssd_bytes,
        "warranty_years": split.ssd.warranty_years,
        "slo_p95_jct_s": slo,
        "unloaded_p95_jct_s": ref["p95_jct_s"],
        "admitted_rate": admitted,
        "slo_met": slo_met,
        "placement_device_years": place,
        "hbm_first_device_years": first,
        "ratio": place / first if first and math.isfinite(first) else math.nan,
        "ratio_vs_frequency_filter": place / freq if freq and math.isfinite(freq) else math.nan,
        "fast_write_share": at[PLACEMENT]["fast_write_share"] if PLACEMENT in at else math.nan,
        "fast_write_share_by_policy": {n: r["fast_write_share"] for n, r in at.items()},
        "device_years": dy,
        "meets_warranty": {n: bool(v >= split.ssd.warranty_years) for n, v in dy.items()},
        "common_rate": common,
        "hit_rate": {n: r["hit_rate"] for n, r in same.items()},
        "hit_rate_by_tier": {
            n: {"dram": r["dram_hit_rate"], "ssd": r["ssd_hit_rate"]} for n, r in same.items()
        },
        "p95_jct_s": {n: r["p95_jct_s"] for n, r in same.items()},
        "p95_jct_s_at_admitted": {n: r["p95_jct_s"] for n, r in at.items()},
        "ssd_write_bytes": {n: r["ssd_write_bytes"] for n, r in at.items()},
        "ssd_write_bytes_total": {n: r["ssd_write_bytes_total"] for n, r in at.items()},
        "ssd_write_rate_bytes_per_s": {n: r["ssd_write_rate_bytes_per_s"] for n, r in at.items()},
        # Where the SSD bytes come from (class -> cause -> bytes; cause = route, and whether the
        # segment was already dead), how many were read back for a hit, how many rewritten.
        "ssd_write_bytes_by_cause": {n: r["ssd_write_bytes_by_cause"] for n, r in at.items()},
        "ssd_read_back_bytes": {n: r["ssd_read_back_bytes"] for n, r in at.items()},
        "ssd_rewritten_bytes": {n: r["ssd_rewritten_bytes"] for n, r in at.items()},
        "materialized_bytes": {n: r["materialized_bytes"] for n, r in at.items()},
        "fast_store_share_by_policy": {n: r["fast_store_share"] for n, r in at.items()},
        "checks": checks,
        "per_rate": {
            n: {f"{rate:g}": dict(row) for rate, row in rows.items()}
            for n, rows in per_rate.items()
        },
    }
