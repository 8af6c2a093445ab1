"""Per-policy metrics over a ladder's runs (one run per seed), in the JSON the CLI writes.

Latency percentiles pool every turn of every seed. Byte, token, throughput and counter figures
are per run, averaged over seeds; ``turns`` is the pooled sample size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from tenure.service.replay.results import RunResult
from tenure.service.replay.stats import SeedSample, bootstrap_ci, clustered_ci, percentile

__all__ = ["samples", "summarize"]


def _canonical_order(run: RunResult) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Turn order independent of completion order: by session, then turn index."""
    session = np.frombuffer(run.turn_session, dtype=np.int64)
    turn = np.frombuffer(run.turn_index, dtype=np.int64)
    return np.asarray(np.lexsort((turn, session)), dtype=np.int64)


def samples(runs: Sequence[RunResult], metric: str) -> list[SeedSample]:
    """``metric`` (``jct_s`` or ``ttft_s``) of each run in canonical turn order."""
    out = []
    for run in runs:
        order = _canonical_order(run)
        values = np.frombuffer(getattr(run, metric), dtype=np.float64)[order]
        roots = np.frombuffer(run.turn_root, dtype=np.int64)[order]
        out.append(SeedSample(values, roots))
    return out


def summarize(runs: Sequence[RunResult], boot: int) -> dict[str, Any]:
    """The issue's per-policy result object (plus a few extra keys)."""
    jct = samples(runs, "jct_s")
    ttft = samples(runs, "ttft_s")
    n = len(runs)
    hit = sum(float(np.sum(np.frombuffer(r.host_hit_tokens, dtype=np.int64))) for r in runs)
    could = sum(float(np.sum(np.frombuffer(r.reusable_tokens, dtype=np.int64))) for r in runs)
    counters: Counter[str] = Counter()
    for r in runs:
        counters.update(r.counters)
    throughput = [
        r.turns / (r.last_completion_s - r.first_arrival_s)
        for r in runs
        if r.last_completion_s > r.first_arrival_s
    ]
    bounded = [r for r in runs if r.bound_work == r.bound_work]  # NaN: not computed
    saved = sum(r.saved_work for r in bounded)
    bound = sum(r.bound_work for r in bounded)
    bounded_f = [r for r in bounded if r.bound_prefill_work == r.bound_prefill_work]
    bound_f = sum(r.bound_prefill_work for r in bounded_f)
    saved_f = sum(r.saved_work for r in bounded_f)
    pooled_jct = np.concatenate([s.values for s in jct])
    pooled_ttft = np.concatenate([s.values for s in ttft])
    return {
        "p50_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "mean_jct_s": float(pooled_jct.mean()) if pooled_jct.size else float("nan"),
        "p95_ttft_s": percentile(ttft, 95),
        "mean_ttft_s": float(pooled_ttft.mean()) if pooled_ttft.size else float("nan"),
        "host_hit_rate": hit / could if could else 0.0,
        # Prefill work saved by host hits over the bound on it for the same run's accesses
        # (tenure.service.replay.bound), summed over seeds; None when no run computed the bound.
        "saved_over_bound": (saved / bound if bound > 0 else 1.0) if bounded else None,
        "saved_over_bound_per_seed": [
            r.saved_work / r.bound_work if r.bound_work > 0 else 1.0 for r in bounded
        ],
        # The same over the tighter bound for an engine that stores during the prefill (vLLM's
        # connector and the replay's engine: bound.prefill_bound's ``prefill_stores``).
        "saved_over_bound_prefill": (
            (saved_f / bound_f if bound_f > 0 else 1.0) if bounded_f else None
        ),
        "saved_work_flops": saved / len(bounded) if bounded else None,
        "bound_work_flops": bound / len(bounded) if bounded else None,
        "bound_seconds": [r.bound_seconds for r in bounded],
        "host_bytes_stored": sum(r.host_bytes_stored for r in runs) / n,
        "host_bytes_loaded": sum(r.host_bytes_loaded for r in runs) / n,
        "prefill_tokens": sum(int(np.sum(np.frombuffer(r.prefill_tokens, np.int64))) for r in runs)
        / n,
        "turns": int(pooled_jct.size),
        "throughput_turns_per_s": float(np.mean(throughput)) if throughput else 0.0,
        "p95_jct_ci": list(bootstrap_ci(jct, 95, boot)),
        "p95_jct_ci_session": list(clustered_ci(jct, 95, boot)),
        "counters": {k: v / n for k, v in sorted(counters.items())},
        "p95_live_sessions": float(np.mean([r.p95_live_sessions for r in runs])),
        "p95_live_working_set_gib": float(np.mean([r.p95_live_working_set_gib for r in runs])),
    }
