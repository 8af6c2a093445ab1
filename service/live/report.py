"""The A/B's figures per arm, live and simulated, as the table, the JSON and the plot.

Definitions (the same for a live arm and a simulated one):

* **host-tier hit rate** = prompt tokens loaded from the host tier / prompt tokens that an
  earlier call of the slice had already computed (so they were offered to the host tier: they
  were in it at some point unless the policy refused or evicted them) and that the engine's own
  prefix cache did not serve. Live: vLLM's ``prompt_tokens_by_source`` counters
  (``external_kv_transfer`` over the slice's seen tokens minus ``local_cache_hit``);
  simulated: the replay's per-turn host hits and reusable tokens.
* **prompt tokens computed** / **cached**: what the engine prefilled vs what it took from a
  cache (its own prefix cache, ``gpu``, or the host tier, ``host``).
* **resumed-turn TTFT**: time to the first streamed chunk of every call but a session's first;
  **JCT**: time to the last chunk, every call.
* **stores refused**: store offers the host tier's policy refused (the gate; LRU refuses only
  an offer larger than what it could ever free); **evictions**: blocks evicted from the host
  tier, by the policy's eviction class (``finished``/``overdue``/``far_wakeup`` for the gate,
  ``recency`` for LRU, ``reclaim`` for a declared last turn).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tenure.service.live.arm import ArmResult, sum_metric
from tenure.service.replay.model import Trace
from tenure.service.replay.results import RunResult

__all__ = [
    "ARM_KEYS",
    "live_arm",
    "plot_ab",
    "simulated_arm",
    "table",
    "write_json",
]

ARM_KEYS = (
    "host_hit_rate",
    "prompt_tokens_computed",
    "prompt_tokens_cached",
    "resumed_ttft_p50_s",
    "resumed_ttft_p95_s",
    "jct_p50_s",
    "jct_p95_s",
    "refused_stores",
    "evictions",
)
_EVICTED = "tenure_adapter_evicted_blocks_total"
_BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def _pct(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else None


def live_arm(result: ArmResult, engine_trace: Trace) -> dict[str, Any]:
    bt = engine_trace.block_tokens
    seen = sum(t.seen_blocks * bt for s in engine_trace.sessions for t in s.turns)
    e = result.engine
    computed = sum_metric(e, _BY_SOURCE, source="local_compute")
    gpu = sum_metric(e, _BY_SOURCE, source="local_cache_hit")
    host = sum_metric(e, _BY_SOURCE, source="external_kv_transfer")
    ok = [r for r in result.records if r.error is None]
    resumed = [r.ttft_s for r in ok if r.turn > 0]
    jct = [r.jct_s for r in ok]
    s = result.sidecar
    evictions: dict[str, int] = {}
    for key, value in s.items():
        if key.startswith(_EVICTED + "{") and value:
            cls = key.split('class="', 1)[1].split('"', 1)[0]
            evictions[cls] = evictions.get(cls, 0) + int(value)
    could = seen - gpu
    adapter = any(k.startswith("tenure_adapter_") for k in s)
    expected = {
        (i, k): (t.input_tokens, t.output_tokens)
        for i, sess in enumerate(engine_trace.sessions)
        for k, t in enumerate(sess.turns)
    }
    mismatched = sum(
        1 for r in ok if (r.prompt_tokens, r.completion_tokens) != expected.get((r.session, r.turn))
    )
    return {
        "host_hit_rate": host / could if could > 0 else 0.0,
        "prompt_tokens": computed + gpu + host,
        "prompt_tokens_computed": computed,
        "prompt_tokens_cached": gpu + host,
        "prompt_tokens_cached_gpu": gpu,
        "prompt_tokens_cached_host": host,
        "host_hit_denominator_tokens": could,
        "resumed_ttft_p50_s": _pct(resumed, 50),
        "resumed_ttft_p95_s": _pct(resumed, 95),
        "jct_p50_s": _pct(jct, 50),
        "jct_p95_s": _pct(jct, 95),
        "refused_stores": int(sum_metric(s, "tenure_adapter_refusals_total")) if adapter else None,
        "refused_blocks": (
            int(sum_metric(s, "tenure_adapter_refused_blocks_total")) if adapter else None
        ),
        "stored_blocks": (
            int(sum_metric(s, "tenure_adapter_stored_blocks_total")) if adapter else None
        ),
        "evictions": evictions if adapter else None,
        "host_bytes_loaded": sum_metric(e, "vllm:kv_offload_load_bytes_total"),
        "host_bytes_stored": sum_metric(e, "vllm:kv_offload_store_bytes_total"),
        "preemptions": sum_metric(e, "vllm:num_preemptions_total"),
        "engine_timing": _engine_timing(e),
        "turns": len(ok),
        "failed_turns": len(result.records) - len(ok),
        "tool_call_answers": sum(1 for r in ok if r.finish_reason == "tool_calls"),
        "token_count_mismatches": mismatched,
        "wall_s": result.wall_s,
        "gate_held_s": result.gate_held_s,
        "gate_forced": result.gate_forced,
    }


_TIMERS = ("queue", "prefill", "decode", "inference", "e2e")


def _engine_timing(e: Mapping[str, float]) -> dict[str, float]:
    """vLLM's own mean per-request times (seconds) and its step count."""
    out: dict[str, float] = {}
    for timer in _TIMERS:
        base = (
            "vllm:e2e_request_latency_seconds"
            if timer == "e2e"
            else (f"vllm:request_{timer}_time_seconds")
        )
        n = sum_metric(e, base + "_count")
        if n:
            out[f"mean_{timer}_s"] = sum_metric(e, base + "_sum") / n
    steps = sum_metric(e, "vllm:iteration_tokens_total_count")
    if steps:
        out["engine_steps"] = steps
        out["mean_tokens_per_step"] = sum_metric(e, "vllm:iteration_tokens_total_sum") / steps
    return out


def simulated_arm(run: RunResult, engine_trace: Trace) -> dict[str, Any]:
    bt = engine_trace.block_tokens

    def total(values: Any) -> int:
        return int(sum(values))

    host = total(run.host_hit_tokens)
    could = total(run.reusable_tokens)
    gpu = total(run.gpu_hit_tokens)
    computed = total(run.prefill_tokens)
    resumed = [v for v, k in zip(run.ttft_s, run.turn_index, strict=True) if k > 0]
    c = run.counters
    evictions = {
        key.removeprefix("evicted_blocks_"): int(v)
        for key, v in c.items()
        if key.startswith("evicted_blocks_") and v
    }
    return {
        "host_hit_rate": host / could if could else 0.0,
        "prompt_tokens": computed + gpu + host,
        "prompt_tokens_computed": computed,
        "prompt_tokens_cached": gpu + host,
        "prompt_tokens_cached_gpu": gpu,
        "prompt_tokens_cached_host": host,
        "host_hit_denominator_tokens": could,
        "resumed_ttft_p50_s": _pct(resumed, 50),
        "resumed_ttft_p95_s": _pct(resumed, 95),
        "jct_p50_s": _pct(list(run.jct_s), 50),
        "jct_p95_s": _pct(list(run.jct_s), 95),
        "refused_stores": int(c.get("refusals", 0)),
        "refused_blocks": int(c.get("refused_blocks", 0)),
        "stored_blocks": int(c.get("stored_blocks", 0)),
        "evictions": evictions,
        "host_bytes_loaded": run.host_bytes_loaded,
        "host_bytes_stored": run.host_bytes_stored,
        "turns": run.turns,
        "makespan_s": run.last_completion_s - run.first_arrival_s,
        "block_tokens": bt,
    }


def _fmt(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "s":
        return f"{value:.3f}"
    if kind == "int":
        return f"{value:,.0f}"
    if kind == "ev":
        return ", ".join(f"{k} {v:,}" for k, v in sorted(value.items())) or "none"
    return str(value)


_ROWS = (
    ("host-tier hit rate", "host_hit_rate", "pct"),
    ("prompt tokens computed", "prompt_tokens_computed", "int"),
    ("prompt tokens cached (gpu)", "prompt_tokens_cached_gpu", "int"),
    ("prompt tokens cached (host)", "prompt_tokens_cached_host", "int"),
    ("resumed-turn TTFT p50 (s)", "resumed_ttft_p50_s", "s"),
    ("resumed-turn TTFT p95 (s)", "resumed_ttft_p95_s", "s"),
    ("turn completion p50 (s)", "jct_p50_s", "s"),
    ("turn completion p95 (s)", "jct_p95_s", "s"),
    ("stores refused", "refused_stores", "int"),
    ("blocks stored", "stored_blocks", "int"),
    ("evictions (blocks)", "evictions", "ev"),
)


def table(
    arms: Mapping[str, Mapping[str, Any]],
    simulated: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """Rows of figures, one column per arm (and per arm simulated), plus the live delta."""
    names = list(arms)
    header = ["", *(f"{n} live" for n in names)]
    if simulated:
        header += [f"{n} sim" for n in names if n in simulated]
    if len(names) == 2:
        header.append(f"{names[1]} - {names[0]} (live)")
    rows = [header]
    for label, key, kind in _ROWS:
        row = [label, *(_fmt(arms[n].get(key), kind) for n in names)]
        if simulated:
            row += [_fmt(simulated[n].get(key), kind) for n in names if n in simulated]
        if len(names) == 2:
            x, y = arms[names[0]].get(key), arms[names[1]].get(key)
            if isinstance(x, int | float) and isinstance(y, int | float):
                if kind == "pct":
                    row.append(f"{100 * (y - x):+.1f} pp")
                elif x:
                    row.append(f"{y - x:+,.3g} ({(y - x) / x:+.1%})")
                else:
                    row.append(f"{y - x:+,.3g}")
            else:
                row.append("")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for j, r in enumerate(rows):
        cells = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n", encoding="utf-8")


def plot_ab(results: Mapping[str, ArmResult], path: Path, title: str) -> None:
    """Host-tier hit rate (cumulative) and resumed-turn TTFT (rolling) per arm over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    colors = {"lru": "#4c72b0"}
    for name, res in results.items():
        color = colors.get(name, "#c44e52")
        pts = [(p.t, 100 * p.host_hit_rate) for p in res.series if p.turns]
        if pts:
            ax1.plot(*zip(*pts, strict=True), label=name, color=color)
        calls = sorted((r.first_token, r.ttft_s) for r in res.records if r.turn > 0 and not r.error)
        if calls:
            window = max(1, len(calls) // 20)
            xs = [calls[i][0] for i in range(window - 1, len(calls))]
            ys = [
                float(np.median([c[1] for c in calls[i - window + 1 : i + 1]]))
                for i in range(window - 1, len(calls))
            ]
            ax2.plot(xs, ys, label=f"{name} (rolling median of {window})", color=color)
    ax1.set_ylabel("host-tier hit rate (%, cumulative)")
    ax1.set_title(title, fontsize=9)
    ax1.legend()
    ax1.grid(alpha=0.3)
    ax2.set_ylabel("resumed-turn TTFT (s)")
    ax2.set_xlabel("seconds since the arm's first session arrived")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
