"""The A/B's paired measures and its verdict: which arm each headline figure favours, or that
the run could not separate them (issue 28).

A single run's two totals (host hits, prompt tokens computed, a latency percentile) say
nothing about how far apart the arms are against the run-to-run noise; paired per-call
differences over the same calls, with bootstrap intervals over sessions, do, and the verdict
names a winner only where the interval excludes 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tenure.service.live.arm import ArmResult
from tenure.service.live.driver import TurnRecord

__all__ = ["HEADLINES", "paired_delta", "say_verdict", "verdict"]


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
        # Separated by the paired prompt-token interval, which stands in for the hit rate's own.
        hit["better"] = treatment if host_pp > 0 else control
        hit["why_not_separated"] = ""
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
