"""The proxy benchmark's plot: latency by percentile, direct vs through the sidecar."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tenure.benchmarks.stats import sorted_percentile

__all__ = ["plot_latency"]


#: Percentiles drawn, spaced evenly in "nines" (50, 90, 99, 99.9 equally apart).
_PLOT_QUANTILES = [1 - 0.5 * 10 ** (-k / 20) for k in range(61)]


def plot_latency(latencies: dict[str, Any], result: dict[str, Any], path: Path) -> None:
    """Latency against percentile on a nines scale: direct, proxied, the gap between them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [-math.log10(1 - q) for q in _PLOT_QUANTILES]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    curves = [("direct (no proxy)", latencies["direct"], "#4c72b0", "--")]
    curves.append(("through the sidecar", latencies["proxied"][0], "#c44e52", "-"))
    if len(latencies["proxied"]) > 1:
        env = ", ".join(f"{k}={v}" for k, v in result["versus"]["env"].items())
        curves.append((f"sidecar with {env}", latencies["proxied"][1], "#55a868", "-."))
    for label, values, color, style in curves:
        ordered = sorted(values)  # once per curve, not once per point
        ys = [sorted_percentile(ordered, q) * 1000 for q in _PLOT_QUANTILES]
        ax.plot(xs, ys, style, color=color, label=label)
    ticks = [0.5, 0.9, 0.99, 0.999]
    ax.set_xticks([-math.log10(1 - q) for q in ticks], [f"p{q * 100:g}" for q in ticks])
    ax.set_yscale("log")
    ax.set_xlabel("percentile")
    ax.set_ylabel("request latency, ms")
    ax.set_title(
        f"concurrency {result['concurrency']}, {result['latency_offered_rps']:g} req/s offered: "
        f"added p50 {result['added_p50_ms']:.2f} ms, p99 {result['added_p99_ms']:.2f} ms",
        fontsize=10,
    )
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
