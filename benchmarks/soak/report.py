"""The soak's figures from its ledger and samples, and its plot over time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tenure.benchmarks.soak.ledger import Ledger

__all__ = ["flatness", "plot", "rerender", "summarize"]

#: Samples before this fraction of the run are warm-up (imports, pools, first sessions): the
#: growth slopes are fitted after it.
WARMUP_FRACTION = 0.2
#: The plateau is judged on the last this-many seconds of the run (or its second half, if
#: shorter): a leak shows there as a slope that a run's early filling cannot explain.
PLATEAU_WINDOW_S = 1800.0
#: A curve is flat when its fitted change over the window is within this fraction of its
#: level, or within :data:`FLAT_FLOOR_MIB` (a small curve's allocator noise).
FLAT_FRACTION = 0.02
FLAT_FLOOR_MIB = 0.5


def _slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(t_s, value)``, per hour; None with fewer than 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return round(cov / var * 3600, 3)


def _fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``(slope per second, intercept)`` of ``(t_s, value)``."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in points) / var
    return slope, mean_v - slope * mean_t


def _curves(samples: list[dict[str, Any]], faults: list[dict[str, Any]]) -> dict[str, Any]:
    """Each memory curve's samples, cut where it starts anew (a restarted sidecar replica, the
    Redis replica promoted by a failover): ``{name: [(t_s, MiB), ...]}``."""
    restart = next((f["healed_s"] for f in faults if f["kind"] == "sidecar_killed"), None)
    promoted = next((f["healed_s"] for f in faults if f["kind"] == "redis_master_killed"), None)
    out: dict[str, list[tuple[float, float]]] = {}
    for key in sorted({k for s in samples for k in s if k.startswith("rss_mib_")}):
        points = [(s["t"], s[key]) for s in samples if s.get(key) is not None]
        if restart is not None and key.endswith("_1"):
            points = [p for p in points if p[0] > restart + 10]
        out[f"sidecar-{key.removeprefix('rss_mib_')} RSS"] = points
    redis = [(s["t"], s["redis_mib"]) for s in samples if s.get("redis_mib") is not None]
    if promoted is not None:
        redis = [p for p in redis if p[0] > promoted + 10]
    out["Redis used_memory"] = redis
    return out


def flatness(
    samples: list[dict[str, Any]], faults: list[dict[str, Any]], duration_s: float
) -> dict[str, Any]:
    """Whether each memory curve has flattened: its least-squares slope over the last
    :data:`PLATEAU_WINDOW_S` (the second half of a shorter run), the change that slope makes
    over the window, and ``flat`` when that change is within :data:`FLAT_FRACTION` of the
    curve's level (or :data:`FLAT_FLOOR_MIB`). ``not_flattened`` names the curves that are
    not, so a report cannot call a still-rising curve a plateau."""
    window = min(PLATEAU_WINDOW_S, duration_s / 2)
    start = duration_s - window
    curves: dict[str, Any] = {}
    for name, points in _curves(samples, faults).items():
        tail = [p for p in points if p[0] >= start]
        fit = _fit(tail)
        if fit is None:
            curves[name] = {"flat": None, "why": "fewer than 3 samples in the window"}
            continue
        slope, intercept = fit
        level = sum(v for _, v in tail) / len(tail)
        change = slope * window
        bound = max(FLAT_FRACTION * level, FLAT_FLOOR_MIB)
        curves[name] = {
            "slope_mib_per_hour": round(slope * 3600, 3),
            "change_over_window_mib": round(change, 3),
            "level_mib": round(level, 2),
            "flat_bound_mib": round(bound, 3),
            "flat": abs(change) <= bound,
            "fit": [round(slope, 9), round(intercept, 4)],
            "samples": len(tail),
        }
    return {
        "window_s": [round(start, 1), round(duration_s, 1)],
        "rule": (
            f"flat: |slope x window| <= max({FLAT_FRACTION:.0%} of the level, {FLAT_FLOOR_MIB} MiB)"
        ),
        "curves": curves,
        "not_flattened": sorted(n for n, c in curves.items() if c.get("flat") is False),
    }


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def _fault_windows(faults: list[dict[str, Any]], slack_s: float) -> list[tuple[float, float]]:
    return [(f["at_s"], f["healed_s"] + slack_s) for f in faults]


def summarize(
    *, args: dict[str, Any], ledger: Ledger, checks: dict[str, Any], faults: list[dict[str, Any]],
    samples: list[dict[str, Any]], duration_s: float, slack_s: float, engines: list[Any],
    moves: int,
) -> dict[str, Any]:  # fmt: skip
    # Failures are excused only while an engine or a sidecar replica is down (plus slack):
    # a Redis failover or a push cut must not fail a proxied request at all.
    excused = _fault_windows(
        [f for f in faults if f["kind"] in ("engine_killed", "sidecar_killed")], slack_s
    )
    windows = _fault_windows(faults, slack_s)
    turns = ledger.turns
    ok = [t for t in turns if t.status == 200]
    outside = [t for t in turns if not any(a <= t.at <= b for a, b in excused)]
    calm = [
        t.latency_s
        for t in turns
        if t.status == 200 and not any(a <= t.at <= b for a, b in windows)
    ]
    stormy = [
        t.latency_s for t in turns if t.status == 200 and any(a <= t.at <= b for a, b in windows)
    ]
    warm = WARMUP_FRACTION * duration_s
    rss: dict[str, float | None] = {}
    for key in sorted({k for s in samples for k in s if k.startswith("rss_mib_")}):
        # A restarted replica starts a new series: fit only its longest uninterrupted run.
        points = [(s["t"], s[key]) for s in samples if s["t"] >= warm and s.get(key) is not None]
        restart = next(
            (f["healed_s"] for f in faults if f["kind"] == "sidecar_killed" and key.endswith("_1")),
            None,
        )
        if restart is not None:
            points = [p for p in points if p[0] > restart + 10] or points
        rss[key] = _slope_per_hour(points)
    kill = next((f["healed_s"] for f in faults if f["kind"] == "redis_master_killed"), None)
    redis_points = [
        (s["t"], s["redis_mib"])
        for s in samples
        if s["t"] >= warm and s.get("redis_mib") is not None
    ]
    if kill is not None:
        # The promoted replica's memory is a new series (it held no replication backlog).
        redis_points = [p for p in redis_points if p[0] > kill + 10] or redis_points
    growth = [v for v in rss.values() if v is not None]
    failures: dict[str, int] = {}
    for t in turns:
        if t.status != 200:
            failures[str(t.status)] = failures.get(str(t.status), 0) + 1
    return {
        "engine": args["engine"],
        "minutes": args["minutes"],
        "sessions_per_s": args["sessions_per_s"],
        "turns": len(turns),
        "sessions_started": len({t.session for t in turns}),
        "sessions_completed": ledger.sessions_done,
        # The front door's answer: the first attempt, or the retry on the other replica.
        "proxied_success_ratio": (
            round(sum(t.status == 200 or t.retried_ok for t in turns) / len(turns), 6)
            if turns
            else None
        ),
        "first_attempt_success_ratio": round(len(ok) / len(turns), 6) if turns else None,
        "proxied_success_ratio_outside_faults": (
            round(sum(t.status == 200 or t.retried_ok for t in outside) / len(outside), 6)
            if outside
            else None
        ),
        "proxied_failures_by_status": failures,
        "retried_ok": sum(t.retried_ok for t in turns),
        **{k: v for k, v in checks.items()},
        "lifecycle_writes_refused_then_retried": ledger.refused_writes,
        "session_moves": moves,
        "rss_growth_mib_per_hour": max(growth) if growth else None,
        "rss_growth_mib_per_hour_by_replica": rss,
        "redis_growth_mib_per_hour": _slope_per_hour(redis_points),
        "p50_latency_ms_outside_faults": _p(calm, 0.5),
        "p99_latency_ms_outside_faults": _p(calm, 0.99),
        "p99_latency_ms_during_faults": _p(stormy, 0.99),
        "plateau": flatness(samples, faults, duration_s),
        "faults": faults,
        "engines": engines,
        "series": {
            "samples": samples,
            "turns": [[round(t.at, 3), t.status, round(t.latency_s * 1000, 2)] for t in turns],
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = result["series"]["turns"]
    samples = result["series"]["samples"]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    buckets: dict[int, list[list[float]]] = {}
    for at, status, latency in turns:
        buckets.setdefault(int(at // 5), []).append([status, latency])
    xs = sorted(buckets)
    rate = [len(buckets[x]) / 5 for x in xs]
    bad = [sum(1 for s, _ in buckets[x] if s != 200) / 5 for x in xs]
    p99 = []
    for x in xs:
        lat = sorted(latency for s, latency in buckets[x] if s == 200)
        p99.append(lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan"))
    t = [x * 5 for x in xs]
    axes[0].plot(t, rate, label="turns/s")
    axes[0].plot(t, bad, color="#c44e52", label="failed turns/s")
    axes[0].set_ylabel("turns/s")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].plot(t, p99, color="#55a868")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("p99 latency, ms (5 s)")
    for key in sorted(k for k in samples[0] if k.startswith("rss_mib_")) if samples else []:
        axes[2].plot(
            [s["t"] for s in samples], [s.get(key) for s in samples], label=f"sidecar-{key[-1]} RSS"
        )
    if samples:
        axes[2].plot(
            [s["t"] for s in samples], [s.get("redis_mib") for s in samples], label="Redis used"
        )
    plateau = result.get("plateau")
    if plateau:
        start, end = plateau["window_s"]
        axes[2].axvline(start, color="black", linewidth=0.6, linestyle=":")
        verdicts = [f"slope over t = {start:g}-{end:g} s (dashed):"]
        for name, curve in plateau["curves"].items():
            if curve.get("fit") is None:
                continue
            slope, intercept = curve["fit"]
            axes[2].plot(
                [start, end], [intercept + slope * start, intercept + slope * end],
                color="black", linewidth=1.0, linestyle="--",
            )  # fmt: skip
            verdict = "flat" if curve["flat"] else "NOT FLATTENED"
            verdicts.append(f"{name}: {curve['slope_mib_per_hour']:+.2f} MiB/h, {verdict}")
        axes[2].text(
            0.99, 0.5, "\n".join(verdicts), transform=axes[2].transAxes, fontsize=7,
            ha="right", va="center", bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0},
        )  # fmt: skip
    axes[2].set_ylabel("MiB")
    axes[2].set_xlabel("seconds")
    axes[2].legend(loc="upper left", fontsize=8)
    colors = {"redis_master_killed": "#dd8452", "sidecar_killed": "#8172b3",
              "engine_killed": "#c44e52", "push_channel_cut": "#937860"}  # fmt: skip
    for fault in result["faults"]:
        for ax in axes:
            ax.axvspan(
                fault["at_s"], fault["healed_s"], color=colors.get(fault["kind"], "grey"), alpha=0.2
            )
        label = fault["kind"].replace("_", " ")
        axes[0].annotate(label, (fault["at_s"], 0), fontsize=7, rotation=90, va="bottom")
    fig.suptitle(
        f"tenure bench soak: {result['minutes']:g} min, engine={result['engine']}, "
        f"success {result['proxied_success_ratio']}, "
        f"writes lost {result['acknowledged_writes_lost']}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def rerender(path: Path, plot_path: Path | None) -> dict[str, Any]:
    """Recompute the plateau verdict of a saved run (``path`` and its ``_series.json``) with
    this module's rules, rewrite ``path`` and redraw the plot: a report rule changed after a
    long run does not need the run again."""
    import json

    result: dict[str, Any] = json.loads(path.read_text())
    series = json.loads(path.with_name(path.stem + "_series.json").read_text())
    duration_s = float(result["minutes"]) * 60
    result["plateau"] = flatness(series["samples"], result["faults"], duration_s)
    path.write_text(json.dumps(result, indent=2) + "\n")
    if plot_path is not None:
        plot({**result, "series": series}, plot_path)
    return result
