"""``tenure replay ttl`` output: the plain-text tables and the plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "drift_table",
    "fine_spread_table",
    "plot_ttl",
    "rule_table",
    "spread_table",
    "table6_table",
]

_POLICIES = ("cpu_ttl", "inf", "10min", "30min", "60min")


def _gain(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def table6_table(cells: Sequence[Mapping[str, Any]]) -> str:
    """Each cell twice: our replay, then the seed's printed row (GPU-s per context)."""
    head = (
        f"{'waits':<12} {'load':>4}  {'':4} "
        + " ".join(f"{p:>7}" for p in _POLICIES)
        + f"  {'controller':>17} {'gain':>6}  {'est-lam':>7} {'1-shot':>7} {'online':>7}"
    )
    lines = [head, "-" * len(head)]
    for cell in cells:
        costs = cell["costs"]
        gain = cell["gain"]
        ctrl = f"{costs['controller']:.3f} ({cell['controller_branch']})"
        lines.append(
            f"{cell['family']:<12} {cell['load']:>4g}  ours "
            + " ".join(f"{costs[p]:>7.3f}" for p in _POLICIES)
            + f"  {ctrl:>17} {_gain(gain['controller']):>6}"
            + f"  {_gain(gain['controller_est']):>7}"
            + f" {_gain(gain.get('controller_est_oneshot')):>7} {_gain(gain['online']):>7}"
        )
        seed = cell.get("seed")
        if seed:
            best = min(seed[p] for p in ("inf", "10min", "30min", "60min"))
            sctrl = f"{seed['controller']:.3f} ({seed['branch']})"
            lines.append(
                f"{'':<12} {'':>4}  seed "
                + " ".join(f"{seed[p]:>7.3f}" for p in _POLICIES)
                + f"  {sctrl:>17} {_gain((best - seed['controller']) / best):>6}"
            )
    lines.append(
        "gain: vs the best fixed timer (inf/10/30/60 min), positive favours the controller; "
        "est-lam: the seed's controller with lambda estimated online, timers re-priced by the "
        "rent clock; 1-shot: the same with each timer fixed at its suspension's estimate; "
        "online: Tenure's online controller from no data."
    )
    return "\n".join(lines)


#: The controllers the retention rule's table shows (issue 26), against the finer grid.
_RULE_COLUMNS = (
    "controller", "online", "rule", "rule_robust", "rule_est", "rule_learn", "rule_online",
)  # fmt: skip


def _scales(values: Sequence[float | None]) -> str:
    """A cell's chosen scales per replicate, compactly (``R``: retain)."""
    return ",".join("R" if v is None else f"{v:.2f}" for v in values)


def rule_table(cells: Sequence[Mapping[str, Any]]) -> str:
    """Per cell: the best timer of the finer grid and each controller's gain against it
    (the real-gap family's bar), with the scales the calibrated rules chose."""
    head = (
        f"{'waits':<12} {'load':>4}  {'best fine':>15}  "
        + " ".join(f"{p:>11}" for p in _RULE_COLUMNS)
        + "  rule / rule_robust scales"
    )
    lines = [head, "-" * len(head)]
    for cell in cells:
        gains = cell.get("gain_fine", {})
        best = f"{cell.get('best_fine_name', '-')} {cell.get('best_fine_cost', 0.0):.4f}"
        lines.append(
            f"{cell['family']:<12} {cell['load']:>4g}  {best:>15}  "
            + " ".join(f"{_gain(gains.get(p)):>11}" for p in _RULE_COLUMNS)
            + f"  {_scales(cell.get('rule_scale', []))} / "
            + _scales(cell.get("rule_robust_scale", []))
        )
    lines.append(
        "gain vs the best fixed timer of the finer grid (5-min steps to 2 h, then 2.5/3/4/6 h, "
        "retain), chosen in hindsight per cell; rule: the timer rule calibrated once (least "
        "expected cost), rule_robust: the same sample, least worst-case regret; rule_est: "
        "rule's scale with lambda estimated; rule_learn: online with the calibration sample "
        "as prior; rule_online: online from no data; scales are multiples of t2 (R: retain)."
    )
    return "\n".join(lines)


def fine_spread_table(spread: Mapping[str, Any], family: str = "claude-code") -> str:
    """``family``'s cells: each controller's gain against the finer grid across base seeds."""
    seeds = spread["seeds"]
    lines = [
        f"{family}: gain over the best fixed timer of the finer grid across {len(seeds)} base "
        "seeds: mean [min, max]",
        f"{'load':>4}  " + " ".join(f"{p:>22}" for p in _RULE_COLUMNS),
    ]
    for cell in spread["cells"]:
        if cell["family"] != family:
            continue
        parts = []
        for policy in _RULE_COLUMNS:
            fine = cell.get(policy, {}).get("fine")
            parts.append(
                "-"
                if fine is None
                else f"{fine['mean'] * 100:+6.2f} [{fine['min'] * 100:+6.1f},"
                f"{fine['max'] * 100:+5.1f}]"
            )
        lines.append(f"{cell['load']:>4g}  " + " ".join(f"{p:>22}" for p in parts))
    lines.append("target (issue 26): mean >= -1%, every seed >= -2%, calibrated and online.")
    return "\n".join(lines)


def spread_table(spread: Mapping[str, Any]) -> str:
    """Per cell: each controller's gain across the base seeds (mean, sd, range, shortfalls)."""
    seeds = spread["seeds"]
    policies = list(spread["acceptance"])
    head = f"{'waits':<12} {'load':>4}  " + "  ".join(f"{p:>36}" for p in policies) + "  wrong"
    lines = [
        f"gain over the best fixed timer across {len(seeds)} independent base seeds "
        f"({', '.join(map(str, seeds))}): mean sd [min, max] short-of-target/seeds",
        head,
        "-" * len(head),
    ]
    for cell in spread["cells"]:
        parts = []
        for policy in policies:
            g = cell[policy]
            short = g["short_of_target"]
            tail = "  -" if short is None else f"{short:>3}"
            parts.append(
                f"{g['mean'] * 100:+6.2f}% {g['sd'] * 100:4.2f} "
                f"[{g['min'] * 100:+6.2f},{g['max'] * 100:+6.2f}] {tail}/{len(seeds)}"
            )
        lines.append(
            f"{cell['family']:<12} {cell['load']:>4g}  "
            + "  ".join(f"{p:>36}" for p in parts)
            + f"  {cell['wrong_branch_replicates']:>5}"
        )
    targets = ", ".join(
        f"{p} >= {t * 100:+.1f}%" for p, t in spread["acceptance"].items() if t is not None
    )
    lines.append(
        f"targets: {targets}; wrong: replicates whose calibration picked the branch the seed's "
        "table does not (seed families only)."
    )
    return "\n".join(lines)


def drift_table(drift: Mapping[str, Any]) -> str:
    lines = [
        f"non-stationary day (GPU-s per context, mean over {len(drift['replicates'])} replicates):",
    ]
    rows: list[tuple[str, float]] = [
        (f"online controller ({drift['online_estimator']})", drift["online_cost"]),
        (f"seed one-shot ({'/'.join(sorted(set(drift['oneshot_branch'])))})",
         drift["oneshot_cost"]),
        ("hindsight best fixed per phase", drift["hindsight_cost"]),
        ("cpu_ttl at the true load", drift["cpu_ttl_true_load"]),
        *((f"fixed {name}", cost) for name, cost in drift["fixed"].items()),
    ]  # fmt: skip
    hindsight = drift["hindsight_cost"]
    for name, cost in rows:
        lines.append(
            f"  {name:<44} {cost:.4f}  ({(cost - hindsight) / hindsight:+.1%} vs hindsight)"
        )
    lines.append("  online controller variants (estimator / ablation):")
    for label, entry in drift["estimators"].items():
        lines.append(
            f"    {label:<42} {entry['cost']:.4f}  lambda error "
            f"{entry['lambda_mean_abs_rel_err']:.1%}  switches {entry['switches']}"
        )
    return "\n".join(lines)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_ttl(doc: Mapping[str, Any], path: Path) -> None:
    """Top: cost against load per family (ours solid, the seed's dotted). Bottom: the day."""
    plt = _pyplot()
    cells = doc["cells"]
    families = list(dict.fromkeys(c["family"] for c in cells))
    drift = doc.get("drift")
    rows = 2 if drift else 1
    fig, axes = plt.subplots(
        rows, max(2, len(families)), figsize=(4.2 * max(2, len(families)), 3.6 * rows),
        squeeze=False,
    )  # fmt: skip
    colors = {"inf": "#4c72b0", "10min": "#8172b2", "30min": "#937860", "60min": "#da8bc3",
              "cpu_ttl": "#55a868", "controller": "#c44e52", "online": "#dd8452"}  # fmt: skip
    for i, family in enumerate(families):
        ax = axes[0][i]
        mine = [c for c in cells if c["family"] == family]
        loads = [c["load"] for c in mine]
        for name, color in colors.items():
            ax.plot(loads, [c["costs"][name] for c in mine], "-o", ms=3, color=color, label=name)
            seed = [c["seed"][name] for c in mine if "seed" in c and name in c["seed"]]
            if len(seed) == len(mine):
                ax.plot(loads, seed, ":", color=color, lw=1)
        has_seed = all("seed" in c for c in mine)
        ax.set_title(f"{family} (dotted: seed)" if has_seed else family, fontsize=9)
        ax.set_xlabel("load (x lambda_crit)")
        ax.set_ylabel("GPU-s per suspended context")
    for j in range(len(families), axes.shape[1]):
        axes[0][j].axis("off")
    axes[0][0].legend(fontsize=7)
    if drift:
        ax = axes[1][0]
        names = ["online", "one-shot", "hindsight", "cpu_ttl@true", *drift["fixed"]]
        values = [drift["online_cost"], drift["oneshot_cost"], drift["hindsight_cost"],
                  drift["cpu_ttl_true_load"], *drift["fixed"].values()]  # fmt: skip
        ax.bar(names, values, color=["#c44e52", "#4c72b0", "#55a868", "#8c8c8c"]
               + ["#bbbbbb"] * len(drift["fixed"]))  # fmt: skip
        ax.set_ylabel("GPU-s per context (day)")
        ax.set_title("non-stationary day", fontsize=9)
        ax.tick_params(axis="x", labelrotation=40, labelsize=7)
        ax = axes[1][1]
        labels = list(drift["estimators"])
        ax.barh(labels, [drift["estimators"][k]["cost"] for k in labels], color="#dd8452")
        ax.axvline(drift["hindsight_cost"], color="#55a868", ls="--", lw=1, label="hindsight")
        ax.axvline(drift["oneshot_cost"], color="#4c72b0", ls=":", lw=1, label="one-shot")
        lo = min(drift["hindsight_cost"], *(drift["estimators"][k]["cost"] for k in labels))
        ax.set_xlim(lo * 0.97, drift["oneshot_cost"] * 1.02)
        ax.tick_params(axis="y", labelsize=7)
        ax.set_title("online controller variants", fontsize=9)
        ax.legend(fontsize=7)
        for j in range(2, axes.shape[1]):
            axes[1][j].axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
