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

from service.live.arm import ArmResult, sum_metric
from service.live.driver import TurnRecord
from service.replay.model import Trace
from service.replay.results import RunResult

__all__ = [
    "ARM_KEYS",
    "HEADLINES",
    "live_arm",
    "paired_delta",
    "plot_ab",
    "say_verdict",
    "simulated_arm",
    "table",
    "verdict",
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


def paired_delta(
    treatment: ArmResult, control: ArmResult, boot: int = 2000, seed: int = 0
) -> dict[str, Any]:
    """Per-call differences (treatment - control) on the same calls, with 95% intervals from a
    bootstrap over sessions (a session brings all its calls): turn completion, resumed-turn
    TTFT, and prompt tokens computed (prompt - cached, from each answer's usage; with the
    interval of their sum over the slice as ``total_computed_tokens``)."""
    a = {(r.session, r.turn): r for r in treatment.records if r.error is None}
    b = {(r.session, r.turn): r for r in control.records if r.error is None}
    keys = sorted(a.keys() & b.keys())
    out: dict[str, Any] = {"paired_calls": len(keys)}
    rng = np.random.default_rng(seed)

    def computed(r: TurnRecord) -> float | None:
        return None if r.cached_tokens is None else float(r.prompt_tokens - r.cached_tokens)

    measures: dict[str, Any] = {
        "jct_s": (lambda r: r.jct_s, False),
        "resumed_ttft_s": (lambda r: r.ttft_s, True),
        "computed_tokens": (computed, False),
    }
    for name, (value, resumed_only) in measures.items():
        rows = []
        for k in keys:
            if resumed_only and not k[1]:
                continue
            x, y = value(a[k]), value(b[k])
            if x is not None and y is not None:
                rows.append((k[0], x - y))
        if not rows:
            continue
        sessions = np.asarray([s for s, _d in rows])
        diffs = np.asarray([d for _s, d in rows])
        uniq = np.unique(sessions)
        groups = [diffs[sessions == u] for u in uniq]
        means = []
        for _ in range(boot):
            pick_s = rng.integers(0, len(groups), len(groups))
            means.append(float(np.mean(np.concatenate([groups[i] for i in pick_s]))))
        lo, hi = np.percentile(means, [2.5, 97.5])
        out[f"mean_{name}"] = [float(diffs.mean()), float(lo), float(hi)]
        if name == "computed_tokens":
            n = len(diffs)
            out["total_computed_tokens"] = [float(diffs.sum()), float(lo * n), float(hi * n)]
    return out


#: The headline figures, in the order the verdict says them.
HEADLINES = ("host_hit_rate", "prompt_tokens_computed", "resumed_ttft", "turn_completion")


def verdict(
    live: Mapping[str, Mapping[str, Any]], delta: Mapping[str, Any], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Per headline figure: the difference (treatment - control), its 95% interval where one
    is measured, and which arm it favours, or ``None`` where the run could not separate the
    arms (an interval that spans 0), with why.

    Hits and tokens have no per-call repeat of their own: prompt tokens computed are judged by
    the paired per-call interval; the host-tier hit rate by the same interval, and only where
    the cached tokens' difference is the host tier's doing (the engine's own prefix cache
    moved less between the arms than the host tier did: with one interleaving in both arms it
    should not move at all), and both say the same thing."""
    control, treatment = names
    c, t = live[control], live[treatment]
    out: list[dict[str, Any]] = []

    def judged(
        figure: str, value: float, ci: Sequence[float] | None, lower_is_better: bool, why: str = ""
    ) -> dict[str, Any]:
        better: str | None = None
        if ci is not None and not why:
            lo, hi = ci[1], ci[2]
            if lo > 0 or hi < 0:
                better = treatment if (hi < 0) == lower_is_better else control
            else:
                why = "its 95% interval spans 0"
        elif ci is None and not why:
            why = "no paired interval"
        return {
            "figure": figure,
            "delta": value,
            "interval": list(ci[1:]) if ci is not None else None,
            "better": better,
            "why_not_separated": why if better is None else "",
        }

    tokens = delta.get("total_computed_tokens")
    host_pp = float(t["host_hit_rate"] - c["host_hit_rate"])
    gpu_moved = abs(t["prompt_tokens_cached_gpu"] - c["prompt_tokens_cached_gpu"])
    host_moved = abs(t["prompt_tokens_cached_host"] - c["prompt_tokens_cached_host"])
    why = ""
    if tokens is None:
        why = "no per-call cached-token counts"
    elif gpu_moved >= host_moved:
        why = (
            f"the engine's prefix cache moved {gpu_moved:,.0f} tokens between the arms, the "
            f"host tier {host_moved:,.0f}"
        )
    else:
        lo, hi = tokens[1], tokens[2]
        if lo <= 0 <= hi:
            why = "the paired prompt-token interval spans 0"
        elif (hi < 0) != (host_pp > 0):
            why = "the hit rates and the paired prompt tokens disagree"
    hit = judged("host_hit_rate", host_pp, None, False, why)
    if not why:
        hit["better"] = treatment if host_pp > 0 else control
        hit["interval_of"] = "total_computed_tokens"
    out.append(hit)
    out.append(
        judged(
            "prompt_tokens_computed",
            float(t["prompt_tokens_computed"] - c["prompt_tokens_computed"]),
            tokens,
            True,
        )
    )
    for figure, key in (("resumed_ttft", "mean_resumed_ttft_s"), ("turn_completion", "mean_jct_s")):
        ci = delta.get(key)
        out.append(judged(figure, ci[0] if ci else float("nan"), ci, True))
    return out


def say_verdict(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """The verdict in words, one line per headline figure."""
    control, treatment = names
    lines = []
    for row in rows:
        figure, value, ci = row["figure"], row["delta"], row["interval"]
        if figure == "host_hit_rate":
            said = f"host-tier hit rate {100 * value:+.1f} pp"
        elif figure == "prompt_tokens_computed":
            said = f"prompt tokens computed {value:+,.0f}"
            if ci:
                said += f" [95% CI {ci[0]:+,.0f}, {ci[1]:+,.0f}] (paired per call)"
        else:
            label = "resumed-turn TTFT" if figure == "resumed_ttft" else "turn completion"
            said = f"{label} {value * 1e3:+.1f} ms per call"
            if ci:
                said += f" [95% CI {ci[0] * 1e3:+.1f}, {ci[1] * 1e3:+.1f}] (paired)"
        if row["better"] is not None:
            said += f": {row['better']} ahead"
        else:
            said += f": not separated ({row['why_not_separated']})"
        lines.append(f"{treatment} - {control}, {said}")
    return lines


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
