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
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "TENURE_ARGV",
    "LocalStack",
    "ManagedProcess",
    "StackConfig",
    "StackError",
    "free_port",
    "http_json",
    "http_ok",
    "scrape",
]

Progress = Callable[[str], None]

#: ``tenure ...`` with this interpreter (the console script may not be on PATH).
TENURE_ARGV = [sys.executable, "-c", "import sys; from service.cli import main; sys.exit(main())"]


class StackError(RuntimeError):
    """A stack component failed to start or answer; the message names it and its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_json(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Any:
    """One JSON request (standard library only: the launcher must not need the web stack)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    for key, value in (headers or {}).items():
        request.add_header(key, value)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        raw = response.read()
    return json.loads(raw) if raw else None


def scrape(url: str, timeout: float = 10.0) -> dict[str, float]:
    """Prometheus text exposition -> ``{'name{label="v"}': value}`` (samples summed by key)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            key = f"{sample.name}{{{labels}}}" if labels else sample.name
            out[key] = out.get(key, 0.0) + sample.value
    return out


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return bool(200 <= response.status < 300)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class ManagedProcess:
    """One child process with its log file; ``stop`` is idempotent."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,  # its own process group: stop() reaches its children
            )
        finally:
            log.close()
        return self

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise StackError(f"{self.name} exited during start-up; see {self.log_path}")
            if ready():
                return
            time.sleep(0.25)
        raise StackError(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def stop(self, timeout: float = 15.0, *, kill: bool = False) -> None:
        """TERM (or KILL at once with ``kill``) the process group, then KILL what remains."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout)
        # Children left in the group (vLLM's EngineCore) go with it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        self.process = None


@dataclass
class StackConfig:
    """Where and how the local stack runs; ports of 0 are picked free at start."""

    workdir: Path
    model_cache: Path
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
    #: Push-channel cadence inside the engine (fast, so a demo sees its counters at once).
    #: Use this Redis instead of starting one (e.g. a test's server).
    external_redis_url: str | None = None
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
        executable = shutil.which("redis-server")
        if executable is None:
            raise StackError(
                "redis-server not found on PATH (Debian: apt-get install redis-server)"
            )
        data = self.config.workdir / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self.progress(f"starting redis-server on 127.0.0.1:{self.config.redis_port}")
        argv = [executable, "--port", str(self.config.redis_port), "--bind", "127.0.0.1"]
        argv += ["--dir", str(data), "--save", "", "--appendonly", "no"]
        self.redis = ManagedProcess("redis-server", argv, self.logs / "redis.log").start()
        port = self.config.redis_port

        def ping() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    return sock.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        self.redis.wait_until(ping, 20)

    def ensure_model(self) -> Path:
        from engine_adapter.testing.tiny_model import ensure_tiny_model

        self.progress(f"preparing the tiny random-weight model in {self.config.model_cache}")
        self.model_path = ensure_tiny_model(self.config.model_cache)
        return self.model_path

    def engine_transfer_config(self) -> dict[str, Any]:
        from engine_adapter.testing.engine import kv_transfer_config

        return kv_transfer_config(
            policy=self.config.policy,
            host_blocks=self.config.host_blocks,
            push_addr=self.push_addr,
            extra={
                "tenure_report_interval_s": self.config.report_interval_s,
                "tenure_hello_interval_s": self.config.hello_interval_s,
            },
        )

    def start_engine(self) -> None:
        from engine_adapter.testing.engine import CPU_ENGINE_ENV, server_args

        model = self.model_path or self.ensure_model()
        args = server_args(
            str(model),
            self.config.engine_port,
            gpu_blocks=self.config.gpu_blocks,
            transfer=self.engine_transfer_config(),
            max_model_len=self.config.max_model_len,
        )
        self.progress(
            f"starting vLLM (CPU) with the Tenure adapter on {self.engine_url} "
            f"(policy {self.config.policy}; ~30 s)"
        )
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]
        # EngineCore in its own process, as in production (a test process may have set the
        # in-process mode for its own engines).
        env = {**CPU_ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
        self.engine = ManagedProcess("vllm", argv, self.logs / "vllm.log", env=env)
        self.engine.start().wait_until(
            lambda: http_ok(f"{self.engine_url}/health"), self.config.engine_timeout_s
        )

    def start_sidecar(self) -> None:
        self.progress(f"starting the Tenure sidecar on {self.proxy_url} (push {self.push_addr})")
        env = {
            "TENURE_REDIS_URL": self.redis_url,
            "TENURE_UPSTREAM_URL": self.engine_url,
            "TENURE_PUSH_ADDR": self.push_addr,
            "TENURE_PUSH_SNAPSHOT_INTERVAL_S": str(self.config.snapshot_interval_s),
            "TENURE_DEV_MODE": "true",
        }
        argv = [*TENURE_ARGV, "serve", "--dev"]
        argv += ["--port", str(self.config.proxy_port), "--log-level", "warning"]
        self.sidecar = ManagedProcess("tenure serve", argv, self.logs / "sidecar.log", env=env)
        self.sidecar.start().wait_until(lambda: http_ok(f"{self.proxy_url}/healthz"), 60)

    def start(self) -> LocalStack:
        self.config.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.config.external_redis_url:
                self.start_redis()
            self.ensure_model()
            # The sidecar binds the push channel first, so the adapter connects at once.
            self.start_sidecar()
            self.start_engine()
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
