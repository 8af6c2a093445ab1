"""docker-compose.yml and the images: services, ports and env wiring agree with each other,
with the sidecar's settings and with the Prometheus scrape targets. No Docker daemon needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

SERVICES = {"redis", "vllm", "tenure", "prometheus", "grafana"}


@pytest.fixture(scope="module")
def compose(repo: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((repo / "docker-compose.yml").read_text())
    return doc


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    assert isinstance(env, dict), "environment must be a mapping"
    return {str(k): str(v) for k, v in env.items()}


def _arg(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def _kv_transfer_config(compose: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = json.loads(
        _arg(compose["services"]["vllm"]["command"], "--kv-transfer-config")
    )
    return config


def test_services_present(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == SERVICES


def test_sidecar_env_are_real_settings(compose: dict[str, Any]) -> None:
    """A typo in a TENURE_ variable would be silently ignored by pydantic-settings."""
    from tenure.service.settings import Settings

    known = {f"TENURE_{name.upper()}" for name in Settings.model_fields}
    env = _env(compose["services"]["tenure"])
    assert set(env) <= known, sorted(set(env) - known)


def test_sidecar_points_at_vllm_and_redis(compose: dict[str, Any]) -> None:
    services = compose["services"]
    env = _env(services["tenure"])
    upstream = urlsplit(env["TENURE_UPSTREAM_URL"])
    assert upstream.hostname == "vllm"
    assert str(upstream.port) == _arg(services["vllm"]["command"], "--port")
    redis_url = urlsplit(env["TENURE_REDIS_URL"])
    assert redis_url.scheme == "redis" and redis_url.hostname == "redis" and redis_url.port == 6379
    assert services["tenure"]["depends_on"]["redis"]["condition"] == "service_healthy"
    published = {p.split(":")[0]: p.split(":")[1] for p in services["tenure"]["ports"]}
    assert published == {"8080": env["TENURE_PORT"]}


def test_admin_token_is_required_not_written_down(compose: dict[str, Any]) -> None:
    env = _env(compose["services"]["tenure"])
    assert env["TENURE_ADMIN_TOKEN"].startswith("${TENURE_ADMIN_TOKEN:?")
    assert "TENURE_DEV_MODE" not in env
    assert _env(compose["services"]["grafana"])["GF_SECURITY_ADMIN_PASSWORD"].startswith(
        "${GRAFANA_ADMIN_PASSWORD:?"
    )


def test_vllm_runs_the_tenure_policy_on_a_gpu(compose: dict[str, Any], repo: Path) -> None:
    vllm = compose["services"]["vllm"]
    config = _kv_transfer_config(compose)
    assert config["kv_connector"] == "OffloadingConnector"
    assert config["kv_role"] == "kv_both"
    extra = config["kv_connector_extra_config"]
    assert extra["eviction_policy"] == "tenure"
    # Tenure's manager (gate + push channel) comes with the plugin's spec, not the stock one.
    from tenure.engine_adapter.plugin import SPECS

    assert extra["spec_name"] in SPECS and "CPU" not in extra["spec_name"]
    assert isinstance(extra["cpu_bytes_to_use"], int) and extra["cpu_bytes_to_use"] > 0
    [device] = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    # The plugin name the config relies on is the entry point the image installs.
    project = tomllib.loads((repo / "pyproject.toml").read_text())
    assert "tenure" in project["project"]["entry-points"]["vllm.general_plugins"]


def test_push_channel_wiring(compose: dict[str, Any]) -> None:
    """The adapter connects to the address the sidecar binds, on the sidecar's service name."""
    sidecar_bind = urlsplit(_env(compose["services"]["tenure"])["TENURE_PUSH_ADDR"])
    assert sidecar_bind.scheme == "tcp" and sidecar_bind.hostname == "0.0.0.0"
    extra = _kv_transfer_config(compose)["kv_connector_extra_config"]
    for addr in (extra["tenure_push_addr"], _env(compose["services"]["vllm"])["TENURE_PUSH_ADDR"]):
        target = urlsplit(addr)
        assert (target.scheme, target.hostname, target.port) == ("tcp", "tenure", sidecar_bind.port)


def test_prometheus_scrapes_compose_services(compose: dict[str, Any], repo: Path) -> None:
    services = compose["services"]
    config = yaml.safe_load((repo / "deploy" / "prometheus" / "prometheus.yml").read_text())
    ports = {
        "tenure": _env(services["tenure"])["TENURE_PORT"],
        "vllm": _arg(services["vllm"]["command"], "--port"),
        "localhost": "9090",
    }
    targets = [
        t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    ]
    assert {t.split(":")[0] for t in targets} == set(ports)
    for target in targets:
        host, port = target.split(":")
        assert port == ports[host], target
    mount = services["prometheus"]["volumes"][0]
    assert mount.startswith("./deploy/prometheus:/etc/prometheus")


def test_bind_mounts_and_dockerfiles_exist(compose: dict[str, Any], repo: Path) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (repo / source).exists(), f"{name}: {source}"
        build = service.get("build")
        if build:
            dockerfile = repo / build["context"] / build["dockerfile"]
            assert dockerfile.is_file(), f"{name}: {dockerfile}"
            # BuildKit's per-Dockerfile ignore file keeps the virtualenv out of the context.
            ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
            rules = [x for x in ignore.read_text().splitlines() if x and not x.startswith("#")]
            assert rules[0] == "*", ignore
            assert {"!service/", "!engine_adapter/", "!clients/", "!pyproject.toml"} <= set(rules)


def test_sidecar_image_runs_tenure_serve(repo: Path) -> None:
    from tenure.service.cli import build_parser

    dockerfile = (repo / "deploy" / "docker" / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["tenure", "serve"]' in dockerfile
    assert "USER 10001" in dockerfile
    # The console script the image calls has a `serve` command.
    parser = build_parser([])
    assert "serve" in parser.format_help()


DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="docker-compose (Debian package, validates without a daemon) is not installed",
)
def test_docker_compose_config_validates(repo: Path, tmp_path: Path) -> None:
    assert DOCKER_COMPOSE is not None
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "GRAFANA_"))}
    base["HOME"] = str(tmp_path)
    ok = subprocess.run(
        [DOCKER_COMPOSE, "-f", "docker-compose.yml", "config", "-q"],
        cwd=repo,
        env={**base, "TENURE_ADMIN_TOKEN": "t" * 32, "GRAFANA_ADMIN_PASSWORD": "p" * 16},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [DOCKER_COMPOSE, "-f", "docker-compose.yml", "config", "-q"],
        cwd=repo,
        env={**base, "GRAFANA_ADMIN_PASSWORD": "p" * 16},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0 and "TENURE_ADMIN_TOKEN" in refused.stderr


# --- the scaled layout (docker-compose.scaled.yml on top) ------------------------------------


@pytest.fixture(scope="module")
def scaled(repo: Path, compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """docker-compose.yml with docker-compose.scaled.yml merged on top (mappings merge, the
    rest is replaced, as ``docker compose -f a -f b`` does for these keys)."""
    overlay: dict[str, Any] = yaml.safe_load((repo / "docker-compose.scaled.yml").read_text())
    services = {name: dict(service) for name, service in compose["services"].items()}
    for name, service in overlay["services"].items():
        base = dict(services.get(name, {}))
        if "extends" in service:
            base = dict(compose["services"][service["extends"]["service"]])
        for key, value in service.items():
            if key == "environment" and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            elif key != "extends":
                base[key] = value
        services[name] = base
    return services


def test_scaled_layout_wiring(scaled: dict[str, dict[str, Any]], repo: Path) -> None:
    """sidecars -> router (consistent_hash on the header they set) -> every engine; each
    engine reports under a listed id to a sidecar's push channel; Redis via three Sentinels."""
    from tenure.service.settings import Settings

    known = {f"TENURE_{name.upper()}" for name in Settings.model_fields}
    sidecars = [n for n in scaled if n.startswith("tenure")]
    engines = [n for n in scaled if n.startswith("vllm")]
    assert len(sidecars) >= 2 and len(engines) >= 2
    router = scaled["router"]
    assert _arg(router["command"], "--policy") == "consistent_hash"
    workers = router["command"][router["command"].index("--worker-urls") + 1 :]
    workers = [
        w for w in workers[: next((i for i, w in enumerate(workers) if w.startswith("--")), None)]
    ]
    assert {urlsplit(w).hostname for w in workers} == set(engines)
    for worker in workers:
        url = urlsplit(worker)
        assert str(url.port) == _arg(scaled[str(url.hostname)]["command"], "--port")
    assert (repo / router["build"]["context"] / router["build"]["dockerfile"]).is_file()
    engine_ids = set()
    for name in sidecars:
        env = _env(scaled[name])
        assert set(env) <= known, sorted(set(env) - known)
        upstream = urlsplit(env["TENURE_UPSTREAM_URL"])
        assert upstream.hostname == "router"
        assert str(upstream.port) == _arg(router["command"], "--port")
        assert "X-Session-ID" in env["TENURE_UPSTREAM_SESSION_HEADERS"].split(",")
        engine_ids = set(env["TENURE_PUSH_ENGINE_IDS"].split(","))
        for address in env["TENURE_REDIS_SENTINELS"].split(","):
            host, port = address.rsplit(":", 1)
            assert host in scaled and port == "26379", address
        assert env["TENURE_REDIS_SENTINEL_MASTER"] == "tenure"
    reported = []
    for name in engines:
        env = _env(scaled[name])
        reported.append(env["TENURE_ENGINE_ID"])
        config = json.loads(_arg(scaled[name]["command"], "--kv-transfer-config"))
        push = urlsplit(config["kv_connector_extra_config"]["tenure_push_addr"])
        assert push.hostname in sidecars and push.geturl() == env["TENURE_PUSH_ADDR"]
    assert sorted(reported) == sorted(engine_ids), "engine ids must be listed, each once"
    sentinel_command = " ".join(scaled["sentinel-1"]["command"])
    assert "sentinel monitor tenure redis 6379 2" in sentinel_command
    assert _arg(scaled["redis-replica"]["command"], "--replicaof") == "redis"


@pytest.mark.skipif(DOCKER_COMPOSE is None, reason="docker-compose is not installed")
def test_scaled_compose_config_validates(repo: Path, tmp_path: Path) -> None:
    assert DOCKER_COMPOSE is not None
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TENURE_", "GRAFANA_"))}
    base["HOME"] = str(tmp_path)
    ok = subprocess.run(
        [DOCKER_COMPOSE, "-f", "docker-compose.yml", "-f", "docker-compose.scaled.yml", "config"],
        cwd=repo,
        env={**base, "TENURE_ADMIN_TOKEN": "t" * 32, "GRAFANA_ADMIN_PASSWORD": "p" * 16},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
    merged = yaml.safe_load(ok.stdout)["services"]
    assert merged["tenure"]["environment"]["TENURE_UPSTREAM_URL"] == "http://router:8000"
    assert merged["vllm-b"]["environment"]["TENURE_ENGINE_ID"] == "engine-b"
