"""Draw each row of the Grafana dashboard from a real run's Prometheus metrics (one PNG a row).

There is no Grafana binary for this machine (Debian ships none; PyPI's ``grafana*`` packages are
API clients), so this reads the dashboard JSON in ``deploy/grafana/dashboards/`` and draws every
panel of a row with matplotlib from the very PromQL its targets hold, asked of the Prometheus
that scraped the run (``/api/v1/query_range``). Grafana's variables are filled in as Grafana
would with their defaults: ``$instance`` = every replica, ``$__rate_interval`` = four scrape
intervals. The pictures show the panels' data, titles, units and legends, not Grafana's styling.

    python scripts/dashboard_shots.py --prometheus http://127.0.0.1:9090 \\
        --start 1764650000 --end 1764650600 --out docs/assets/dashboards

``scripts/dashboard_run.sh`` makes such a run (the local stack, a Prometheus with the shipped
rules, agent traffic) and calls this at its end.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy/grafana/dashboards/tenure-overview.json"
#: Grafana's unit ids as a reader says them (an id not listed is shown as it is).
UNITS = {
    "short": "",
    "none": "",
    "reqps": "requests/s",
    "ops": "per second",
    "s": "seconds",
    "Bps": "bytes/s",
    "bytes": "bytes",
    "percentunit": "fraction",
}


@dataclass
class Panel:
    title: str
    unit: str
    targets: list[tuple[str, str]]  # (expr, legendFormat)


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


def dashboard_rows(dashboard: dict[str, Any]) -> list[Row]:
    """The dashboard's rows in order, each with its panels (Grafana's flat ``panels`` list:
    a ``row`` panel starts a row; a collapsed row keeps its panels inside it)."""
    rows: list[Row] = []
    for panel in dashboard["panels"]:
        if panel.get("type") == "row":
            rows.append(Row(panel.get("title", "")))
            inner = panel.get("panels", [])
        else:
            if not rows:
                rows.append(Row(dashboard.get("title", "")))
            inner = [panel]
        for item in inner:
            unit = item.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
            targets = [
                (t["expr"], t.get("legendFormat", ""))
                for t in item.get("targets", [])
                if t.get("expr")
            ]
            rows[-1].panels.append(Panel(item.get("title", ""), unit, targets))
    return rows


def fill_variables(expr: str, rate_interval_s: int) -> str:
    """Grafana's variables as it fills them with the dashboard's defaults."""
    expr = expr.replace('{instance=~"$instance"}', "").replace('instance=~"$instance",', "")
    expr = expr.replace(',instance=~"$instance"', "")
    return expr.replace("$__rate_interval", f"{rate_interval_s}s")


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def query_range(
    prometheus: str, expr: str, start: float, end: float, step_s: int
) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step_s})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{query}", timeout=30) as r:
        answer = json.load(r)
    if answer.get("status") != "success":
        raise RuntimeError(f"prometheus refused {expr!r}: {answer}")
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def draw_row(
    row: Row, prometheus: str, start: float, end: float, step_s: int, out: Path
) -> tuple[int, int]:
    """One PNG for ``row``; returns (panels, panels with data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 3
    lines = (len(row.panels) + columns - 1) // columns
    fig, axes = plt.subplots(
        lines, columns, figsize=(15, 3.6 * lines), squeeze=False, constrained_layout=True
    )
    with_data = 0
    for index, panel in enumerate(row.panels):
        ax = axes[index // columns][index % columns]
        drawn = 0
        for expr, fmt in panel.targets:
            for series in query_range(
                prometheus, fill_variables(expr, 4 * step_s), start, end, step_s
            ):
                points = [(float(t) - start, float(v)) for t, v in series["values"]]
                points = [(t, v) for t, v in points if v == v]  # NaN: no rate yet
                if not points:
                    continue
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, linewidth=1.2, label=legend(fmt, series["metric"])[:48])
                drawn += 1
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("seconds into the run", fontsize=8)
        unit = UNITS.get(panel.unit, panel.unit)
        if unit:
            ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if drawn:
            with_data += 1
            ax.legend(fontsize=6, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data in this run", ha="center", va="center",
                    transform=ax.transAxes, color="grey")  # fmt: skip
    for index in range(len(row.panels), lines * columns):
        axes[index // columns][index % columns].axis("off")
    fig.suptitle(row.title, fontsize=13, fontweight="bold")
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return len(row.panels), with_data


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", required=True, help="base URL of the run's Prometheus")
    parser.add_argument("--start", type=float, required=True, help="unix time the run began")
    parser.add_argument("--end", type=float, required=True, help="unix time the run ended")
    parser.add_argument("--step-s", type=int, default=5, help="resolution (the scrape interval)")
    parser.add_argument("--dashboard", type=Path, default=DASHBOARD)
    parser.add_argument("--out", type=Path, required=True, help="folder for row-<n>-<slug>.png")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = dashboard_rows(json.loads(args.dashboard.read_text()))
    for number, row in enumerate(rows, 1):
        path = args.out / f"row-{number}-{slug(row.title)}.png"
        panels, with_data = draw_row(row, args.prometheus, args.start, args.end, args.step_s, path)
        print(f"{path}: {row.title}: {with_data} of {panels} panels with data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
