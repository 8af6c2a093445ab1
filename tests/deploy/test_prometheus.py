"""Prometheus config and alert rules: valid for promtool, unit-tested, on real metric names."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

#: ``tenure_`` series names in PromQL (recording rules are named ``tenure:``, which this skips).
TENURE_SERIES = re.compile(r"\b(tenure_[a-z0-9_]+)")
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_config_is_valid(repo: Path) -> None:
    result = _promtool("check", "config", "prometheus.yml", cwd=repo / "deploy" / "prometheus")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout


@needs_promtool
def test_rules_are_valid(repo: Path) -> None:
    result = _promtool("check", "rules", "rules.yml", cwd=repo / "deploy" / "prometheus")
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_rules_unit_tests_pass(repo: Path) -> None:
    result = _promtool("test", "rules", "prometheus_rules_test.yml", cwd=repo / "tests" / "deploy")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _rules(repo: Path) -> list[dict[str, object]]:
    doc = yaml.safe_load((repo / "deploy" / "prometheus" / "rules.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_every_alert_has_a_unit_test(repo: Path) -> None:
    """An alert nobody has seen fire is an alert that may never fire."""
    alerts = {str(r["alert"]) for r in _rules(repo) if "alert" in r}
    tests = yaml.safe_load((repo / "tests" / "deploy" / "prometheus_rules_test.yml").read_text())
    tested = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert alerts, "no alerts found"
    assert alerts <= tested, f"alerts never shown firing: {sorted(alerts - tested)}"


def test_rules_use_only_exported_metrics(repo: Path, exported_series: frozenset[str]) -> None:
    used = {name for rule in _rules(repo) for name in TENURE_SERIES.findall(str(rule["expr"]))}
    assert used, "rules reference no tenure_ metrics"
    assert used <= exported_series, (
        f"not exported by tenure.service.metrics: {sorted(used - exported_series)}"
    )


def test_every_alert_explains_itself(repo: Path) -> None:
    for rule in _rules(repo):
        if "alert" not in rule:
            continue
        assert re.match(r"^Tenure[A-Z]\w+$", str(rule["alert"]))
        labels = rule.get("labels") or {}
        assert isinstance(labels, dict) and labels.get("severity") in {"warning", "critical"}
        annotations = rule.get("annotations") or {}
        assert isinstance(annotations, dict)
        assert annotations.get("summary") and annotations.get("description"), rule["alert"]
