"""``tenure up --keep-running``: the last arm's stack stays up, with a local Prometheus.

Prometheus (Debian's ``prometheus`` binary, which ``scripts/bootstrap.sh`` installs) scrapes
the sidecar's and the engine's ``/metrics`` every 5 s, bound to 127.0.0.1, its data in the
work directory; it stops with the stack (Ctrl-C, or a component exiting).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

from tenure.service.live.stack import ABStack
from tenure.service.processes import ManagedProcess, free_port, http_ok

__all__ = ["prometheus_config", "serve_until_interrupted", "start_prometheus"]


def prometheus_config(sidecar: str, engine: str, interval_s: float = 5.0) -> str:
    """A scrape config for the two targets (``host:port``)."""
    return (
        "global:\n"
        f"  scrape_interval: {interval_s:g}s\n"
        "scrape_configs:\n"
        "  - job_name: tenure-sidecar\n"
        "    static_configs:\n"
        f"      - targets: ['{sidecar}']\n"
        "  - job_name: vllm\n"
        "    static_configs:\n"
        f"      - targets: ['{engine}']\n"
    )


def start_prometheus(stack: ABStack, root: Path) -> tuple[ManagedProcess, str] | None:
    """Start Prometheus for ``stack``; ``None`` (and the stack serves on) if it is missing."""
    binary = shutil.which("prometheus")
    if binary is None:
        return None
    port = free_port()
    home = root / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    host = "127.0.0.1"
    config.write_text(
        prometheus_config(f"{host}:{stack.config.proxy_port}", f"{host}:{stack.config.engine_port}")
    )
    argv = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={home / 'data'}",
        f"--web.listen-address={host}:{port}",
    ]
    process = ManagedProcess("prometheus", argv, stack.logs / "prometheus.log").start()
    url = f"http://{host}:{port}"
    process.wait_until(lambda: http_ok(f"{url}/-/ready"), 30)
    return process, url


def serve_until_interrupted(stack: ABStack, root: Path, say: Callable[[str], None]) -> int:
    prom = start_prometheus(stack, root)
    url = stack.proxy_url
    say(f"serving ({stack.config.policy}): proxy {url}/v1, OpenAPI docs {url}/docs, "
        f"metrics {url}/metrics, engine {stack.engine_url}/metrics")  # fmt: skip
    if prom is None:
        say("prometheus not found on PATH (Debian: apt-get install prometheus); not started")
    else:
        say(f"prometheus {prom[1]} scrapes both every 5 s (e.g. {prom[1]}/graph)")
    say("Ctrl-C stops everything")
    try:
        while all(p is not None and p.running for p in (stack.redis, stack.engine, stack.sidecar)):
            if prom is not None and not prom[0].running:
                break
            time.sleep(1.0)
        say("a component exited; stopping")
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        if prom is not None:
            prom[0].stop()
