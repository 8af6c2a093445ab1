"""Grafana dashboards and provisioning: valid JSON, real metric names, wired to Prometheus."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

TENURE_SERIES = re.compile(r"\b(tenure_[a-z0-9_]+)")
RECORDED = re.compile(r"\b(tenure:[a-z0-9_:]+)")
VLLM_SERIES = re.compile(r"\b(vllm:[a-z0-9_]+)")
#: vLLM metrics the overview must show beside Tenure's own (VLLM_SEAMS.md).
REQUIRED_VLLM = {
    "vllm:kv_offload_store_bytes_total",
    "vllm:kv_offload_load_bytes_total",
    "vllm:external_prefix_cache_hits_total",
    "vllm:prefix_cache_hits_total",
    "vllm:kv_cache_usage_perc",
}


def _dashboards(repo: Path) -> list[Path]:
    return sorted((repo / "deploy" / "grafana" / "dashboards").glob("*.json"))


def _exprs(dashboard: dict[str, Any]) -> Iterator[str]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[str]:
        for panel in panels:
            for target in panel.get("targets", []):
                yield str(target["expr"])
            yield from walk(panel.get("panels", []))

    yield from walk(dashboard["panels"])


def test_dashboards_exist(repo: Path) -> None:
    assert [p.name for p in _dashboards(repo)], "no dashboards under deploy/grafana/dashboards"


@pytest.mark.parametrize("name", ["tenure-overview.json"])
def test_dashboard_parses_and_is_well_formed(repo: Path, name: str) -> None:
    dashboard = json.loads((repo / "deploy" / "grafana" / "dashboards" / name).read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]


def test_every_tenure_metric_in_dashboards_is_exported(
    repo: Path, exported_series: frozenset[str]
) -> None:
    for path in _dashboards(repo):
        used = {
            m for expr in _exprs(json.loads(path.read_text())) for m in TENURE_SERIES.findall(expr)
        }
        assert used, f"{path.name} uses no tenure_ metric"
        missing = used - exported_series
        assert not missing, (
            f"{path.name}: not exported by tenure.service.metrics: {sorted(missing)}"
        )


def test_recorded_series_in_dashboards_have_rules(repo: Path) -> None:
    rules = yaml.safe_load((repo / "deploy" / "prometheus" / "rules.yml").read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    for path in _dashboards(repo):
        used = {m for expr in _exprs(json.loads(path.read_text())) for m in RECORDED.findall(expr)}
        assert used <= recorded, f"{path.name}: no recording rule for {sorted(used - recorded)}"


def test_overview_shows_vllm_metrics_beside_tenure(repo: Path) -> None:
    path = repo / "deploy" / "grafana" / "dashboards" / "tenure-overview.json"
    used = {m for expr in _exprs(json.loads(path.read_text())) for m in VLLM_SERIES.findall(expr)}
    assert used >= REQUIRED_VLLM, sorted(REQUIRED_VLLM - used)


def test_provisioning_points_at_the_mounted_dashboards(repo: Path) -> None:
    grafana = repo / "deploy" / "grafana" / "provisioning"
    providers = yaml.safe_load((grafana / "dashboards" / "tenure.yml").read_text())["providers"]
    datasources = yaml.safe_load((grafana / "datasources" / "prometheus.yml").read_text())
    [source] = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    compose = yaml.safe_load((repo / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    dashboards_mount = next(m for m in mounts if m.startswith("./deploy/grafana/dashboards:"))
    assert dashboards_mount.split(":")[1] == providers[0]["options"]["path"]
