"""Kubernetes manifests: they parse, and their names, selectors, ports and settings agree.

No cluster here, so this checks what a cluster would reject or silently mis-wire: selectors that
select nothing, Services pointing at ports no container has, settings the sidecar would ignore,
a token outside the Secret.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: Kinds that run pods from a template.
WORKLOADS = ("Deployment", "StatefulSet")


@pytest.fixture(scope="module")
def manifests(repo: Path) -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted((repo / "deploy" / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is None:
                continue
            key = (doc["kind"], doc["metadata"]["name"])
            assert key not in objects, f"duplicate {key}"
            objects[key] = doc
    return objects


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    [container] = containers
    return container


def _port(container: dict[str, Any], name_or_number: str | int) -> int:
    for port in container.get("ports", []):
        if name_or_number in (port.get("name"), port["containerPort"]):
            return int(port["containerPort"])
    raise AssertionError(f"container {container['name']} has no port {name_or_number!r}")


def _service_target(
    manifests: dict[tuple[str, str], dict[str, Any]], host: str, port: int
) -> tuple[dict[str, Any], int]:
    """The workload a ``host:port`` inside the cluster reaches, and the container port. A
    StatefulSet pod's own name (``vllm-0.vllm``) reaches that pod through the headless
    Service, if the ordinal exists."""
    pod, _, service_name = host.partition(".")
    if service_name:
        service = manifests[("Service", service_name)]
        assert service["spec"].get("clusterIP") == "None", f"{service_name} is not headless"
        workload, container_port = _service_target(manifests, service_name, port)
        assert workload["kind"] == "StatefulSet" and workload["spec"]["serviceName"] == service_name
        name, _, ordinal = pod.rpartition("-")
        assert name == workload["metadata"]["name"] and ordinal.isdigit(), host
        assert int(ordinal) < workload["spec"]["replicas"], f"{host}: no such replica"
        return workload, container_port
    service = manifests[("Service", host)]
    [spec_port] = [p for p in service["spec"]["ports"] if p["port"] == port]
    selector = service["spec"]["selector"]
    targets = [
        d
        for (kind, _), d in manifests.items()
        if kind in WORKLOADS
        and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert len(targets) == 1, f"Service {host} selects {len(targets)} workloads"
    return targets[0], _port(_container(targets[0]), spec_port["targetPort"])


def test_every_file_is_listed_in_the_kustomization(repo: Path) -> None:
    k8s = repo / "deploy" / "k8s"
    kustomization = yaml.safe_load((k8s / "kustomization.yaml").read_text())
    files = {p.name for p in k8s.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    assert kustomization["namespace"] == "tenure"


def test_objects_are_well_formed(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    assert {k for k, _ in manifests} >= {"Deployment", "Service", "ConfigMap", "Secret"}
    for (kind, name), doc in manifests.items():
        assert doc["apiVersion"], (kind, name)
        assert DNS_1123.match(name), name
        if kind in WORKLOADS:
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
            container = _container(doc)
            assert container["resources"]["requests"], name
            assert container.get("readinessProbe"), name


def test_services_reach_container_ports(manifests: dict[tuple[str, str], dict[str, Any]]) -> None:
    for (kind, name), service in manifests.items():
        if kind == "Service":
            for port in service["spec"]["ports"]:
                _service_target(manifests, name, port["port"])


def test_sidecar_is_replicated_and_scraped(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    sidecar = manifests[("Deployment", "tenure")]
    assert sidecar["spec"]["replicas"] >= 2
    pdb = manifests[("PodDisruptionBudget", "tenure")]
    assert 1 <= pdb["spec"]["minAvailable"] < sidecar["spec"]["replicas"]
    for key in (("Deployment", "tenure"), ("StatefulSet", "vllm")):
        deployment = manifests[key]
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert annotations["prometheus.io/path"] == "/metrics"
        _port(_container(deployment), int(annotations["prometheus.io/port"]))


def test_settings_come_from_configmap_and_secret(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    from tenure.service.settings import Settings, SettingsError, load_settings

    container = _container(manifests[("Deployment", "tenure")])
    sources = {
        next(iter(source)): next(iter(source.values()))["name"] for source in container["envFrom"]
    }
    config = manifests[("ConfigMap", sources["configMapRef"])]["data"]
    secret = manifests[("Secret", sources["secretRef"])]["stringData"]
    known = {f"TENURE_{name.upper()}" for name in Settings.model_fields}
    assert set(config) | set(secret) <= known, sorted((set(config) | set(secret)) - known)
    assert "TENURE_ADMIN_TOKEN" in secret and "TENURE_ADMIN_TOKEN" not in config
    assert "TENURE_DEV_MODE" not in config
    # Shipped empty: the sidecar must refuse to start until an operator sets a real token.
    assert secret["TENURE_ADMIN_TOKEN"] == ""
    with pytest.raises(SettingsError, match="TENURE_ADMIN_TOKEN"):
        load_settings(admin_token=secret["TENURE_ADMIN_TOKEN"], dev_mode=False)
    json.loads(secret["TENURE_TENANTS"])


def _flag_values(args: list[str], flag: str) -> list[str]:
    """The values after ``flag`` up to the next ``--flag``."""
    start = args.index(flag) + 1
    values = []
    for arg in args[start:]:
        if arg.startswith("--"):
            break
        values.append(arg)
    return values


def test_sidecar_reaches_the_router_the_engines_and_redis(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """sidecar -> vllm-router (consistent_hash, every engine pod listed) -> vLLM pods; the
    session header is set; the engine ids are the pods' names; Redis through Sentinel."""
    from tenure.service.settings import load_settings

    config = manifests[("ConfigMap", "tenure-settings")]["data"]
    upstream = urlsplit(config["TENURE_UPSTREAM_URL"])
    router, router_port = _service_target(
        manifests, str(upstream.hostname), int(upstream.port or 80)
    )
    assert router["metadata"]["name"] == "vllm-router"
    args = _container(router)["args"]
    assert int(args[args.index("--port") + 1]) == router_port
    assert args[args.index("--policy") + 1] == "consistent_hash"
    assert "X-Session-ID" in config["TENURE_UPSTREAM_SESSION_HEADERS"].split(",")
    engines = manifests[("StatefulSet", "vllm")]
    workers = _flag_values(args, "--worker-urls")
    assert len(workers) == engines["spec"]["replicas"] >= 2
    for worker in workers:
        url = urlsplit(worker)
        engine, port = _service_target(manifests, str(url.hostname), int(url.port or 80))
        assert engine is engines
        engine_args = _container(engine)["args"]
        assert int(engine_args[engine_args.index("--port") + 1]) == port
    ids = {f"vllm-{i}" for i in range(engines["spec"]["replicas"])}
    assert set(config["TENURE_PUSH_ENGINE_IDS"].split(",")) == ids
    env = {e["name"]: e for e in _container(engines)["env"]}
    assert env["TENURE_ENGINE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # Redis: the Sentinels (each one a pod of the sentinel StatefulSet) watch redis-0.
    sentinels = config["TENURE_REDIS_SENTINELS"].split(",")
    assert len(sentinels) >= 3
    for address in sentinels:
        host, port = address.rsplit(":", 1)
        workload, _ = _service_target(manifests, host, int(port))
        assert workload["metadata"]["name"] == "redis-sentinel"
    sentinel_args = " ".join(_container(manifests[("StatefulSet", "redis-sentinel")])["args"])
    master = config["TENURE_REDIS_SENTINEL_MASTER"]
    assert f"sentinel monitor {master} redis-0.redis 6379 2" in sentinel_args
    store, _ = _service_target(manifests, "redis-0.redis", 6379)
    assert store["metadata"]["name"] == "redis" and store["spec"]["replicas"] >= 2
    settings = load_settings(
        **{k.removeprefix("TENURE_").lower(): v for k, v in config.items()}, dev_mode=True
    )
    assert settings.redis_sentinels and settings.session_header_names == ("X-Session-ID",)
    sidecar = _container(manifests[("Deployment", "tenure")])
    assert _port(sidecar, "http") == int(config["TENURE_PORT"])


def test_vllm_runs_tenure_and_reaches_the_push_channel(
    manifests: dict[tuple[str, str], dict[str, Any]],
) -> None:
    engine = _container(manifests[("StatefulSet", "vllm")])
    args = engine["args"]
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    extra = kv["kv_connector_extra_config"]
    assert kv["kv_connector"] == "OffloadingConnector" and extra["eviction_policy"] == "tenure"
    from tenure.engine_adapter.plugin import SPECS

    assert extra["spec_name"] in SPECS and "CPU" not in extra["spec_name"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {e["name"]: e.get("value") for e in engine["env"]}
    bind = urlsplit(manifests[("ConfigMap", "tenure-settings")]["data"]["TENURE_PUSH_ADDR"])
    for addr in (extra["tenure_push_addr"], env["TENURE_PUSH_ADDR"]):
        target = urlsplit(addr)
        assert target.scheme == "tcp"
        sidecar, port = _service_target(manifests, str(target.hostname), int(target.port or 0))
        assert sidecar["metadata"]["name"] == "tenure" and port == bind.port
    # The host tier lives in the pod's memory: the request must cover it.
    host_tier_gib = extra["cpu_bytes_to_use"] / 2**30
    assert int(engine["resources"]["requests"]["memory"].removesuffix("Gi")) > host_tier_gib


def test_probes_hit_a_real_sidecar_route(
    manifests: dict[tuple[str, str], dict[str, Any]], repo: Path
) -> None:
    from tenure.service.app import create_app
    from tenure.service.settings import load_settings

    app = create_app(load_settings(admin_token="deploy-test-token", push_addr=""))
    paths = {getattr(route, "path", None) for route in app.routes}
    sidecar = _container(manifests[("Deployment", "tenure")])
    for probe in ("readinessProbe", "livenessProbe"):
        assert sidecar[probe]["httpGet"]["path"] in paths
    assert "/healthz" in (repo / "deploy" / "docker" / "Dockerfile").read_text()
    assert "/healthz" in paths


def test_scrape_config_relabels_jobs_the_alerts_use(
    manifests: dict[tuple[str, str], dict[str, Any]], repo: Path
) -> None:
    config_text = manifests[("ConfigMap", "tenure-prometheus")]["data"]["prometheus.yml"]
    config = yaml.safe_load(config_text)
    relabels = config["scrape_configs"][0]["relabel_configs"]
    jobs = {r["replacement"] for r in relabels if r.get("target_label") == "job"}
    rules = (repo / "deploy" / "prometheus" / "rules.yml").read_text()
    for job in re.findall(r'job="([^"]+)"', rules):
        assert job in jobs, job
    components = {
        d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
        for (kind, _), d in manifests.items()
        if kind in WORKLOADS
    }
    assert {r["regex"] for r in relabels if r.get("target_label") == "job"} <= components


def test_scrape_config_passes_promtool(
    manifests: dict[tuple[str, str], dict[str, Any]], tmp_path: Path
) -> None:
    config_text = manifests[("ConfigMap", "tenure-prometheus")]["data"]["prometheus.yml"]
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    (tmp_path / "prometheus.yml").write_text(config_text)
    result = subprocess.run(
        [promtool, "check", "config", "prometheus.yml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if "kubernetes_sd_configs not found" in result.stderr:
        pytest.skip("this promtool build has no Kubernetes service discovery (Debian's)")
    assert result.returncode == 0, result.stderr
