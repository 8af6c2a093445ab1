"""A local Tenure stack on one machine: Redis, a CPU vLLM server with the adapter, the sidecar.

What ``tenure up`` runs for newcomers (and what the end-to-end tests start): every process is a
real one, bound to 127.0.0.1, its output in a log file under the stack's work directory, and
stopped (TERM, then KILL) when the stack stops. The engine is vLLM's CPU build serving a tiny
random-weight model generated locally, with the offloading connector, the Tenure policy and the
host-copy offloading spec, so the whole path (proxy -> hints -> engine -> push channel ->
metrics) runs on a laptop with no GPU and no download.
"""

from __future__ import annotations

import contextlib
import time
import urllib.error
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tenure.service.processes import (
    ManagedProcess,
    StackError,
    free_port,
    http_json,
    http_ok,
    scrape,
    start_redis,
)
from tenure.service.stack.launch import TENURE_ARGV, engine_process, start_sidecar

__all__ = ["TENURE_ARGV", "LocalStack", "StackConfig", "running_stack"]

Progress = Callable[[str], None]


@dataclass
class StackConfig:
    """Where and how the local stack runs; ports of 0 are picked free at start."""

    workdir: Path
    model_cache: Path
    #: Serve this checkpoint instead of generating the tiny random-weight one in
    #: ``model_cache`` (``python -m tenure.service.tools.tiny_model`` writes that one by hand).
    model: Path | None = None
    policy: str = "tenure"
    proxy_port: int = 0
    engine_port: int = 0
    redis_port: int = 0
    push_port: int = 0
    #: The engine's own KV pool and the host tier, in 128-token blocks (small: so offloading
    #: and the gate have work to do even in a short demo).
    gpu_blocks: int = 6
    host_blocks: int = 12
    #: (gpu_blocks - 1) * 128: the longest context the small pool can hold.
    max_model_len: int = 640
    engine_timeout_s: float = 240.0
    #: Use this Redis instead of starting one (e.g. a test's server).
    external_redis_url: str | None = None
    #: Push-channel cadence inside the engine (fast, so a demo sees its counters at once).
    report_interval_s: float = 0.5
    hello_interval_s: float = 1.0
    snapshot_interval_s: float = 2.0


class LocalStack:
    """Start, restart and stop the components; ``with LocalStack(...) as stack:`` stops all."""

    def __init__(self, config: StackConfig, progress: Progress | None = None) -> None:
        self.config = config
        self.progress: Progress = progress or (lambda _line: None)
        for name in ("proxy_port", "engine_port", "redis_port", "push_port"):
            if getattr(config, name) == 0:
                setattr(config, name, free_port())
        self.logs = config.workdir / "logs"
        self.redis: ManagedProcess | None = None
        self.engine: ManagedProcess | None = None
        self.sidecar: ManagedProcess | None = None
        self.model_path: Path | None = None

    # --- addresses ------------------------------------------------------------------------

    @property
    def proxy_url(self) -> str:
        return f"http://127.0.0.1:{self.config.proxy_port}"

    @property
    def engine_url(self) -> str:
        return f"http://127.0.0.1:{self.config.engine_port}"

    @property
    def redis_url(self) -> str:
        if self.config.external_redis_url:
            return self.config.external_redis_url
        return f"redis://127.0.0.1:{self.config.redis_port}/0"

    @property
    def push_addr(self) -> str:
        return f"tcp://127.0.0.1:{self.config.push_port}"

    # --- components -----------------------------------------------------------------------

    def start_redis(self) -> None:
        self.progress(f"starting redis-server on 127.0.0.1:{self.config.redis_port}")
        self.redis = start_redis(
            self.config.redis_port, self.config.workdir / "redis", self.logs / "redis.log"
        )

    def ensure_model(self) -> Path:
        if self.config.model is not None:
            self.model_path = self.config.model
            return self.model_path
        from tenure.service.tools.tiny_model import ensure_tiny_model

        self.progress(f"preparing the tiny random-weight model in {self.config.model_cache}")
        self.model_path = ensure_tiny_model(self.config.model_cache)
        return self.model_path

    def engine_transfer_config(self) -> dict[str, Any]:
        from tenure.engine_adapter.cpu_engine import kv_transfer_config

        return kv_transfer_config(
            policy=self.config.policy,
            host_blocks=self.config.host_blocks,
            push_addr=self.push_addr,
            extra={
                "tenure_report_interval_s": self.config.report_interval_s,
                "tenure_hello_interval_s": self.config.hello_interval_s,
            },
        )

    def engine_argv(self) -> list[str]:
        """The vLLM server's arguments (after ``python -m ...api_server``)."""
        from tenure.engine_adapter.cpu_engine import server_args

        assert self.model_path is not None
        return server_args(
            str(self.model_path),
            self.config.engine_port,
            gpu_blocks=self.config.gpu_blocks,
            transfer=self.engine_transfer_config(),
            max_model_len=self.config.max_model_len,
        )

    def engine_banner(self) -> str:
        return (
            f"starting vLLM (CPU) with the Tenure adapter on {self.engine_url} "
            f"(policy {self.config.policy}; ~30 s)"
        )

    def start_engine(self) -> None:
        if self.model_path is None:
            self.ensure_model()
        self.progress(self.engine_banner())
        self.engine = engine_process("vllm", self.engine_argv(), self.logs / "vllm.log")
        self.engine.start().wait_until(
            lambda: http_ok(f"{self.engine_url}/health"), self.config.engine_timeout_s
        )

    def sidecar_env(self) -> dict[str, str]:
        return {
            "TENURE_REDIS_URL": self.redis_url,
            "TENURE_UPSTREAM_URL": self.engine_url,
            "TENURE_PUSH_ADDR": self.push_addr,
            "TENURE_PUSH_SNAPSHOT_INTERVAL_S": str(self.config.snapshot_interval_s),
        }

    def start_sidecar(self) -> None:
        self.progress(f"starting the Tenure sidecar on {self.proxy_url} (push {self.push_addr})")
        self.sidecar = start_sidecar(
            "tenure serve", self.config.proxy_port, self.sidecar_env(), self.logs / "sidecar.log"
        )

    @property
    def uses_adapter(self) -> bool:
        """Whether the engine runs the Tenure adapter (which reports on the push channel)."""
        return True

    def start(self) -> LocalStack:
        self.config.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.config.external_redis_url:
                self.start_redis()
            self.ensure_model()
            # The sidecar binds the push channel first, so the adapter connects at once.
            self.start_sidecar()
            self.start_engine()
            if self.uses_adapter:
                self.wait_for_adapter()
        except BaseException:
            self.stop()
            raise
        self.progress("stack is up")
        return self

    def wait_for_adapter(self, timeout: float = 30.0, exclude: frozenset[str] = frozenset()) -> str:
        """Wait until the sidecar has heard from an adapter (not in ``exclude``); its id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(urllib.error.URLError, OSError, ValueError):
                adapters = http_json("GET", f"{self.proxy_url}/healthz", timeout=5)["push_adapters"]
                fresh = [a for a in adapters if a not in exclude]
                if fresh:
                    return str(fresh[0])
            time.sleep(0.25)
        raise StackError(f"no engine adapter reached the sidecar's push channel in {timeout:.0f}s")

    def restart_sidecar(self, *, kill: bool = True) -> None:
        """Kill (or stop) the sidecar and start it again on the same ports."""
        if self.sidecar is not None:
            self.sidecar.stop(kill=kill)
        self.start_sidecar()

    def restart_engine(self, *, kill: bool = True) -> str:
        """Kill (or stop) the vLLM server, start it again; returns the new adapter's id."""
        known = frozenset(self.adapters())
        if self.engine is not None:
            self.engine.stop(kill=kill)
        self.start_engine()
        return self.wait_for_adapter(exclude=known)

    def adapters(self) -> list[str]:
        """Adapter ids the sidecar heard from recently."""
        health = http_json("GET", f"{self.proxy_url}/healthz", timeout=5)
        return [str(a) for a in health["push_adapters"]]

    def stop(self) -> None:
        for component in (self.sidecar, self.engine, self.redis):
            if component is not None:
                component.stop()
        self.progress("stack stopped")

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- traffic --------------------------------------------------------------------------

    def chat(
        self,
        messages: list[dict[str, str]],
        *,
        session: str | None = None,
        expected_gap_ms: int | None = None,
        last_turn: bool = False,
        max_tokens: int = 8,
    ) -> dict[str, Any]:
        headers: dict[str, str] = {}
        if session is not None:
            headers["X-Tenure-Session"] = session
        if expected_gap_ms is not None:
            headers["X-Tenure-Expected-Gap-Ms"] = str(expected_gap_ms)
        if last_turn:
            headers["X-Tenure-Last-Turn"] = "true"
        body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        result: dict[str, Any] = http_json(
            "POST", f"{self.proxy_url}/v1/chat/completions", body, headers
        )
        return result

    def sidecar_metrics(self) -> dict[str, float]:
        return scrape(f"{self.proxy_url}/metrics")

    def engine_metrics(self) -> dict[str, float]:
        return scrape(f"{self.engine_url}/metrics")

    def wait_metric(
        self, name: str, predicate: Callable[[float], bool], timeout: float = 15.0
    ) -> float:
        """Poll the sidecar's ``/metrics`` until sample ``name`` satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        value = 0.0
        while time.monotonic() < deadline:
            value = self.sidecar_metrics().get(name, 0.0)
            if predicate(value):
                return value
            time.sleep(0.2)
        raise StackError(f"metric {name} stayed at {value} for {timeout:.0f}s")


@contextlib.contextmanager
def running_stack(config: StackConfig, progress: Progress | None = None) -> Iterator[LocalStack]:
    stack = LocalStack(config, progress)
    with stack:
        yield stack
