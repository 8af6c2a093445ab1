"""The placement experiment as a table (what ``tenure replay placement`` prints) and a plot."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["placement_table", "plot_placement"]


def _years(v: float) -> str:
    return "inf" if math.isinf(v) else f"{v:.1f}"


def placement_table(doc: Mapping[str, Any]) -> str:
    lines: list[str] = []
    cfg = doc["config"]
    r = doc.get("reasoning", {})
    lines.append(
        f"{cfg.get('trace', '')}  hardware={cfg['hardware']}  rates={cfg['rates']}  "
        f"seeds={cfg['seeds']}  SLO = {cfg['slo_factor']:g} x unloaded p95 JCT "
        f"(write-through at {cfg['reference_rate']:g}/s)  sessions={cfg.get('root_sessions', '?')}"
    )
    if r:
        lines.append(
            f"reasoning (estimated): {r['reasoning_calls']} of {r['calls']} calls, "
            f"mean {r['mean_reasoning_tokens_per_reasoning_call']:.0f} tokens, "
            f"{100 * r['reasoning_share_of_reasoning_calls_output']:.0f}% of their output"
        )
    for c in doc["configs"]:
        lines.append("")
        lines.append(
            f"== {c['name']}: DRAM {c['dram_gib']:g} GiB, {c['ssd']} "
            f"({c['ssd_bytes'] / 1e12:g} TB), SLO p95 <= {c['slo_p95_jct_s']:.1f} s "
            f"(unloaded {c['unloaded_p95_jct_s']:.1f} s), warranty {c['warranty_years']:g} y"
        )
        r = c["common_rate"]
        cols = (
            f"{'contender':<20} {'admitted':>8} {'SLO':>4} {'SSD TB':>7} {'off-SSD%':>8} "
            f"{'MB/s':>6} {'dev-years':>9} {'reasoning':>9} {'lead':>7} {'worker':>7} | "
            f"{'p95@' + f'{r:g}':>10} {'hit%':>6} {'ssd hit%':>8}"
        )
        lines.append(cols)
        lines.append("-" * len(cols))
        for name, dy in c["device_years"].items():
            by = c["ssd_write_bytes"][name]
            lines.append(
                f"{name:<20} {c['admitted_rate'][name]:>8g} "
                f"{'ok' if c['slo_met'][name] else 'NO':>4} "
                f"{c['ssd_write_bytes_total'][name] / 1e12:>7.2f} "
                f"{100 * c['fast_write_share_by_policy'][name]:>8.1f} "
                f"{c['ssd_write_rate_bytes_per_s'][name] / 1e6:>6.2f} {_years(dy):>9} "
                f"{by.get('reasoning', 0) / 1e12:>9.3f} {by.get('lead', 0) / 1e12:>7.3f} "
                f"{by.get('worker', 0) / 1e12:>7.3f} | {c['p95_jct_s'][name]:>10.1f} "
                f"{100 * c['hit_rate'][name]:>6.2f} "
                f"{100 * c['hit_rate_by_tier'][name]['ssd']:>8.2f}"
            )
        lines.extend(_decomposition(c))
        checks = c.get("checks", {})
        lines.append(
            f"placement/dram-first = {c['ratio']:.2f}x, placement/frequency-filter = "
            f"{c['ratio_vs_frequency_filter']:.2f}x (device-years at each one's admitted load); "
            "hit% and p95 at the placement's admitted load; "
            + ", ".join(
                f"{k}={'yes' if v else 'NO'}" for k, v in checks.items() if isinstance(v, bool)
            )
        )
    return "\n".join(lines)


def _decomposition(c: Mapping[str, Any]) -> list[str]:
    """SSD TB by class and cause for DRAM-first and the placement, and what was read back."""
    causes = c.get("ssd_write_bytes_by_cause")
    if not causes:
        return []
    out = ["SSD TB written by class (live / dead when written) and read back for a hit:"]
    for name in ("dram-first", "lachesis"):
        if name not in causes:
            continue
        parts = []
        for cls in ("lead", "reasoning", "worker", "reviewer", "output"):
            by = causes[name].get(cls, {})
            if not by:
                continue
            live = sum(v for k, v in by.items() if k.endswith("_live")) / 1e12
            dead = sum(v for k, v in by.items() if k.endswith("_dead")) / 1e12
            parts.append(f"{cls} {live:.2f}/{dead:.2f}")
        back = sum(c["ssd_read_back_bytes"][name].values()) / 1e12
        again = sum(c["ssd_rewritten_bytes"][name].values()) / 1e12
        out.append(
            f"  {name:<18} " + ", ".join(parts) + f"; read back {back:.2f}, rewritten {again:.2f}"
        )
    place = causes.get("lachesis", {})
    total = c["ssd_write_bytes_total"].get("lachesis", 0.0)
    live_lead = sum(v for k, v in place.get("lead", {}).items() if k.endswith("_live"))
    first = c["ssd_write_bytes_total"].get("dram-first")
    if total and live_lead and first:
        out.append(
            f"  live lead context (evicted from DRAM while its session runs) is "
            f"{100 * live_lead / total:.0f}% of the placement's SSD bytes; a placement that "
            f"writes only that reaches {first / live_lead:.2f}x DRAM-first"
        )
    return out


def plot_placement(doc: Mapping[str, Any], path: Path) -> None:
    """Device-years (log) with the warranty line, share of writes kept off the SSD, p95 vs SLO."""
    from tenure.service.replay.plot import _pyplot

    plt = _pyplot()
    configs = doc["configs"]
    names = list(configs[0]["device_years"])
    splits = [c["name"] for c in configs]
    width = 0.8 / max(1, len(names))
    cmap = plt.get_cmap("tab10")
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    for j, name in enumerate(names):
        xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(splits))]
        color = cmap(j % 10)
        hatch = "//" if name.startswith("lachesis") else None
        dy = [min(c["device_years"][name], 1e4) for c in configs]
        axes[0].bar(xs, dy, width, label=name, color=color, hatch=hatch)
        share = [100 * c["fast_write_share_by_policy"][name] for c in configs]
        axes[1].bar(xs, share, width, color=color, hatch=hatch)
        p95 = [c["p95_jct_s"][name] for c in configs]  # at the common (placement's) load
        axes[2].bar(xs, p95, width, color=color, hatch=hatch)
    warranty = configs[0]["warranty_years"]
    axes[0].axhline(warranty, color="black", linestyle="--", linewidth=1)
    axes[0].text(-0.45, warranty * 1.05, f"warranty {warranty:g} y", fontsize=8)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("SSD device-years\n(24x7 at the admitted load)")
    axes[1].set_ylabel("newly materialized KV\nkept off the SSD (%)")
    for i, c in enumerate(configs):
        axes[2].hlines(c["slo_p95_jct_s"], i - 0.45, i + 0.45, colors="black", linestyles="--")
    axes[2].set_ylabel("p95 turn JCT (s), common load\n(dashed: SLO)")
    axes[2].set_ylim(0, 3 * max(c["slo_p95_jct_s"] for c in configs))
    axes[2].set_xticks(range(len(splits)))
    axes[2].set_xticklabels(splits)
    axes[0].legend(fontsize=7, ncol=3, loc="upper left")
    cfg = doc["config"]
    axes[0].set_title(
        f"{Path(str(cfg.get('trace', ''))).parent.name} on {cfg['hardware']}: "
        f"placement onto an SSD tier, SLO {cfg['slo_factor']:g}x unloaded p95",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
