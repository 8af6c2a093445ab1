"""Plots of ladder and sweep JSON (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["plot_ladder", "plot_sweep"]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ladder(ladder: Mapping[str, Any], path: Path) -> None:
    """p95 JCT with its session-clustered CI, and host hit rate, per policy."""
    plt = _pyplot()
    results = ladder["results"]
    names = list(results)
    p95 = [results[n]["p95_jct_s"] for n in names]
    ci = [results[n].get("p95_jct_ci_session") or results[n]["p95_jct_ci"] for n in names]
    err = [
        [max(0.0, v - lo) for v, (lo, _hi) in zip(p95, ci, strict=True)],
        [max(0.0, hi - v) for v, (_lo, hi) in zip(p95, ci, strict=True)],
    ]
    hit = [100.0 * results[n]["host_hit_rate"] for n in names]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    colors = ["#c44e52" if n.startswith(("tenure", "gate")) else "#4c72b0" for n in names]
    ax1.bar(names, p95, yerr=err, color=colors, capsize=3)
    ax1.set_ylabel("p95 turn completion time (s)")
    cfg = ladder["config"]
    trace = Path(str(cfg.get("trace", ""))).parent.name
    ax1.set_title(
        f"{trace} on {cfg['hardware']}: {cfg['arrival_rate']} sessions/s, "
        f"host {cfg['host_gib']} GiB, p95 live WS {cfg['p95_live_working_set_gib']:.0f} GiB, "
        f"seeds {cfg['seeds']}",
        fontsize=9,
    )
    ax2.bar(names, hit, color=colors)
    ax2.set_ylabel("host hit rate (%)")
    ax2.tick_params(axis="x", labelrotation=45)
    for label in ax2.get_xticklabels():
        label.set_horizontalalignment("right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_sweep(sweep: Mapping[str, Any], path: Path) -> None:
    """p95 JCT and host hit rate against the swept parameter, one line per policy."""
    plt = _pyplot()
    values = sweep["values"]
    points = sweep["points"]
    policies = list(points[0]["results"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in policies:
        p95 = [pt["results"][name]["p95_jct_s"] for pt in points]
        hit = [100.0 * pt["results"][name]["host_hit_rate"] for pt in points]
        style = "-o" if name.startswith(("tenure", "gate")) else "--."
        ax1.plot(values, p95, style, label=name)
        ax2.plot(values, hit, style, label=name)
    label = sweep["param"]
    ax1.set_xlabel(label)
    ax2.set_xlabel(label)
    ax1.set_ylabel("p95 turn completion time (s)")
    ax2.set_ylabel("host hit rate (%)")
    ax1.set_yscale("log")
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
