"""A real Prometheus scrapes a real sidecar and evaluates Tenure's rules and every dashboard query.

promtool checks syntax of the rule files only; dashboard PromQL has no checker, and a typo there
shows up as an empty panel in production. Here the Prometheus server itself parses and runs each
query (Grafana's ``$__rate_interval`` / ``$instance`` substituted), against series scraped from
a sidecar that served real traffic (engine faked at its transport, Redis real).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
import yaml

from tenure.service.processes import free_port
from tests.conftest import poll

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)"
)


class _Body(httpx.AsyncByteStream):
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._data


def _engine(request: httpx.Request) -> httpx.Response:
    reply = {
        "id": "c1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
    }  # fmt: skip
    return httpx.Response(
        200, headers={"content-type": "application/json"}, stream=_Body(json.dumps(reply).encode())
    )


@pytest.fixture
def sidecar_port(redis_url: str) -> Iterator[int]:
    from tenure.service.app import create_app
    from tenure.service.settings import load_settings

    settings = load_settings(
        redis_url=redis_url,
        upstream_url="http://engine.test",
        admin_token="deploy-test-token",
        push_addr="",
        # Sessions by state are sampled every 5th refresh: each second here, not each 10 s.
        refresh_interval_s=0.2,
    )
    app = create_app(settings, upstream_transport=httpx.MockTransport(_engine))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "sidecar did not start"
        time.sleep(0.02)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        with httpx.Client(timeout=10) as http:
            for turn in range(3):
                response = http.post(
                    f"{base}/chat/completions",
                    headers={"X-Tenure-Session": "live-1", "X-Tenure-Expected-Gap-Ms": "500"},
                    json={"model": "m", "messages": [{"role": "user", "content": f"turn {turn}"}]},
                )
                assert response.status_code == 200, response.text
            assert http.post(f"{base}/sessions/live-1/suspend", json={}).status_code == 200
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def prometheus(sidecar_port: int, repo: Path, tmp_path: Path) -> Iterator[str]:
    assert PROMETHEUS is not None
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(repo / "deploy" / "prometheus" / "rules.yml")],
        "scrape_configs": [
            {
                "job_name": "tenure-sidecar",
                "static_configs": [{"targets": [f"127.0.0.1:{sidecar_port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "prometheus did not become ready"
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _wait_for(url: str, expr: str, timeout_s: float = 30) -> list[dict[str, Any]]:
    return poll(lambda: _query(url, expr), timeout_s, interval_s=0.5)


def _suspended_in_sidecar(port: int) -> bool:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return any(
        line.startswith('tenure_sessions{state="suspended"}') and float(line.split()[-1]) > 0
        for line in text.splitlines()
    )


def _dashboard_exprs(repo: Path) -> list[str]:
    exprs: list[str] = []
    for path in sorted((repo / "deploy" / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            exprs.extend(t["expr"] for t in panel.get("targets", []))
    return exprs


def test_rules_and_dashboards_run_on_real_scrapes(
    prometheus: str, sidecar_port: int, repo: Path
) -> None:
    up = _wait_for(prometheus, 'up{job="tenure-sidecar"} == 1')
    assert up, "the sidecar was never scraped"
    requests = _wait_for(prometheus, 'tenure_requests_total{route="chat"}')
    assert sum(float(r["value"][1]) for r in requests) >= 3
    # The sidecar's own gauge first (its sampling), then the scrape that carries it.
    gauge = 'tenure_sessions{state="suspended"}'
    sampled = poll(lambda: _suspended_in_sidecar(sidecar_port), 60, interval_s=0.2)
    assert sampled, "the sidecar's sessions-by-state gauge never showed the suspended session"
    sessions = _wait_for(prometheus, f"{gauge} > 0", timeout_s=60)
    assert sessions, "sessions by state never showed the suspended session"

    for expr in _dashboard_exprs(repo):
        _query(prometheus, expr.replace("$__rate_interval", "1m").replace("$instance", ".*"))

    # Every rule group has been evaluated, and no rule failed to evaluate.
    def evaluated() -> list[dict[str, Any]]:
        groups = httpx.get(f"{prometheus}/api/v1/rules", timeout=10).json()["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        done = rules and all(r.get("lastEvaluation", "").startswith("20") for r in rules)
        return groups if done else []

    groups = poll(evaluated, 60, interval_s=0.5)
    assert groups, "rules were not evaluated"
    rules = [rule for group in groups for rule in group["rules"]]
    assert {g["name"] for g in groups} == {"tenure.recording", "tenure.alerts"}
    assert all(rule["health"] == "ok" for rule in rules), [
        (r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"
    ]
