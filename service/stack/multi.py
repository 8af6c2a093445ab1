"""Several engines behind ``vllm-router``, several sidecar replicas, Redis with Sentinel.

The scaled-out layout of ``deploy/`` on one machine, with real processes bound to 127.0.0.1
(what the multi-engine integration test and ``tenure bench soak`` run)::

    client -> sidecar-0 | sidecar-1 -> vllm-router (consistent_hash on X-Session-ID)
                                           -> engine-0 | engine-1 (CPU vLLM + adapter)
    sidecars <-> Redis (master + replica + 3 Sentinels, or one server)
    engine-i's adapter -> push channel of sidecar-(i mod N); every sidecar forwards every
    decision (they all tail the one decision stream), each adapter applies its sessions'.

``fake_engines`` replaces vLLM with the canned upstream of ``tenure bench proxy`` (a pure
sidecar soak: no adapter, no push traffic in). Every process is stopped by :meth:`stop`.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tenure.service.processes import (
    ManagedProcess,
    StackError,
    free_port,
    http_json,
    http_ok,
    start_redis,
)
from tenure.service.processes.redis_groups import SentinelGroup
from tenure.service.stack.launch import engine_process, start_sidecar

__all__ = ["MultiStack", "MultiStackConfig"]

#: The header vllm-router's consistent_hash policy keys on first.
SESSION_HEADER = "X-Session-ID"


@dataclass
class MultiStackConfig:
    workdir: Path
    model_cache: Path
    engines: int = 2
    sidecars: int = 2
    #: The canned upstream instead of vLLM (no adapters).
    fake_engines: bool = False
    #: Redis with Sentinel (master + replica + 3 Sentinels); false: one redis-server.
    sentinel: bool = True
    #: Use this Redis URL instead of starting any (e.g. a test's server).
    external_redis_url: str | None = None
    policy: str = "tenure"
    gpu_blocks: int = 6
    host_blocks: int = 12
    max_model_len: int = 640
    engine_timeout_s: float = 300.0
    redis_retry_after_s: float = 0.5
    #: Extra ``TENURE_*`` settings for every sidecar.
    sidecar_env: dict[str, str] = field(default_factory=dict)


class MultiStack:
    def __init__(self, config: MultiStackConfig, progress: object = None) -> None:
        self.config = config
        self.progress = progress if callable(progress) else (lambda _line: None)
        self.logs = config.workdir / "logs"
        self.sentinel: SentinelGroup | None = None
        self.redis: ManagedProcess | None = None
        self.redis_port = free_port()
        self.sidecar_ports = [free_port() for _ in range(config.sidecars)]
        self.push_ports = [free_port() for _ in range(config.sidecars)]
        self.engine_ports = [free_port() for _ in range(config.engines)]
        self.router_port = free_port()
        self.sidecars: list[ManagedProcess | None] = [None] * config.sidecars
        self.engines: list[ManagedProcess | None] = [None] * config.engines
        self.router: ManagedProcess | None = None
        self.model_path: Path | None = None

    # --- addresses --------------------------------------------------------------------------

    def engine_id(self, i: int) -> str:
        return f"engine-{i}"

    def engine_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.engine_ports[i]}"

    def sidecar_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.sidecar_ports[i]}"

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def redis_url(self) -> str:
        if self.config.external_redis_url:
            return self.config.external_redis_url
        return f"redis://127.0.0.1:{self.redis_port}/0"

    # --- components -------------------------------------------------------------------------

    def start_redis(self) -> None:
        if self.config.external_redis_url:
            return
        if self.config.sentinel:
            self.progress("starting Redis: master + replica + 3 Sentinels")
            self.sentinel = SentinelGroup(self.config.workdir / "redis").start()
            return
        data = self.config.workdir / "redis"
        self.redis = start_redis(self.redis_port, data, self.logs / "redis.log")

    def _redis_env(self) -> dict[str, str]:
        if self.sentinel is not None:
            return {
                "TENURE_REDIS_URL": "redis://127.0.0.1:6379/0",  # db and credentials only
                "TENURE_REDIS_SENTINELS": self.sentinel.sentinel_addresses,
                "TENURE_REDIS_SENTINEL_MASTER": self.sentinel.name,
            }
        return {"TENURE_REDIS_URL": self.redis_url}

    def start_sidecar(self, i: int) -> None:
        env = {
            **self._redis_env(),
            "TENURE_UPSTREAM_URL": self.router_url,
            "TENURE_UPSTREAM_SESSION_HEADERS": SESSION_HEADER,
            "TENURE_PUSH_ADDR": f"tcp://127.0.0.1:{self.push_ports[i]}",
            "TENURE_PUSH_SNAPSHOT_INTERVAL_S": "2",
            "TENURE_PUSH_ENGINE_IDS": ",".join(
                self.engine_id(e) for e in range(self.config.engines)
            ),
            "TENURE_REDIS_RETRY_AFTER_S": str(self.config.redis_retry_after_s),
            **self.config.sidecar_env,
        }
        self.progress(f"starting sidecar-{i} on {self.sidecar_url(i)}")
        self.sidecars[i] = start_sidecar(
            f"sidecar-{i}", self.sidecar_ports[i], env, self.logs / f"sidecar-{i}.log"
        )

    def ensure_model(self) -> Path:
        from tenure.service.tools.tiny_model import ensure_tiny_model

        self.model_path = ensure_tiny_model(self.config.model_cache)
        return self.model_path

    def start_engine(self, i: int, *, wait: bool = True) -> None:
        log = self.logs / f"engine-{i}.log"
        if self.config.fake_engines:
            argv = [
                sys.executable,
                "-m",
                "tenure.benchmarks.proxy_load",
                "--port",
                str(self.engine_ports[i]),
            ]
            process = ManagedProcess(f"engine-{i}", argv, log)
        else:
            from tenure.engine_adapter.cpu_engine import kv_transfer_config, server_args

            model = self.model_path or self.ensure_model()
            transfer = kv_transfer_config(
                policy=self.config.policy,
                host_blocks=self.config.host_blocks,
                push_addr=f"tcp://127.0.0.1:{self.push_ports[i % self.config.sidecars]}",
                extra={
                    "tenure_engine_id": self.engine_id(i),
                    "tenure_report_interval_s": 0.5,
                    "tenure_hello_interval_s": 1.0,
                },
            )
            args = server_args(
                str(model),
                self.engine_ports[i],
                gpu_blocks=self.config.gpu_blocks,
                transfer=transfer,
                max_model_len=self.config.max_model_len,
            )
            process = engine_process(f"engine-{i}", args, log)
        self.progress(f"starting engine-{i} on {self.engine_url(i)}")
        self.engines[i] = process.start()
        if wait:
            self.wait_engine(i)

    def wait_engine(self, i: int) -> None:
        process = self.engines[i]
        assert process is not None
        timeout = 30 if self.config.fake_engines else self.config.engine_timeout_s
        process.wait_until(lambda: http_ok(f"{self.engine_url(i)}/health"), timeout)

    def start_router(self) -> None:
        executable = shutil.which("vllm-router") or str(Path(sys.executable).parent / "vllm-router")
        if not Path(executable).exists():
            raise StackError("vllm-router not found: pip install 'tenure[router]'")
        argv = [
            executable,
            "--host", "127.0.0.1",
            "--port", str(self.router_port),
            "--worker-urls", *(self.engine_url(i) for i in range(self.config.engines)),
            "--policy", "consistent_hash",
            # A dead engine leaves the ring within a second or two; its sessions move.
            "--health-check-interval-secs", "1",
            "--health-failure-threshold", "1",
            "--health-success-threshold", "1",
            "--health-check-timeout-secs", "1",
            "--worker-startup-timeout-secs", str(int(self.config.engine_timeout_s)),
            "--prometheus-port", str(free_port()),
            "--log-level", "warning",
        ]  # fmt: skip
        self.progress(
            f"starting vllm-router (consistent_hash on {SESSION_HEADER}) on {self.router_url}"
        )
        self.router = ManagedProcess("vllm-router", argv, self.logs / "router.log").start()
        self.router.wait_until(lambda: http_ok(f"{self.router_url}/health"), 60)

    def start(self) -> MultiStack:
        self.config.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.start_redis()
            # Sidecars first: their push channels are bound when the adapters connect.
            for i in range(self.config.sidecars):
                self.start_sidecar(i)
            for i in range(self.config.engines):
                self.start_engine(i, wait=False)  # start together: ~30 s, not ~30 s each
            for i in range(self.config.engines):
                self.wait_engine(i)
            self.start_router()
            if not self.config.fake_engines:
                self.wait_adapters(
                    {self.engine_id(i) for i in range(self.config.engines)}, timeout=60
                )
        except BaseException:
            self.stop()
            raise
        self.progress("multi-engine stack is up")
        return self

    # --- faults -----------------------------------------------------------------------------

    def kill_engine(self, i: int) -> None:
        process = self.engines[i]
        if process is not None:
            process.stop(kill=True)

    def kill_sidecar(self, i: int) -> None:
        process = self.sidecars[i]
        if process is not None:
            process.stop(kill=True)

    # --- views ------------------------------------------------------------------------------

    def adapters(self) -> set[str]:
        """Adapter (engine) ids heard by any sidecar replica."""
        seen: set[str] = set()
        for i in range(self.config.sidecars):
            with contextlib.suppress(OSError, ValueError):
                seen.update(
                    http_json("GET", f"{self.sidecar_url(i)}/healthz", timeout=5)["push_adapters"]
                )
        return seen

    def wait_adapters(self, wanted: set[str], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if wanted <= self.adapters():
                return
            time.sleep(0.25)
        raise StackError(f"adapters {sorted(wanted - self.adapters())} never reached a sidecar")

    def stop(self) -> None:
        for process in [*self.sidecars, self.router, *self.engines, self.redis]:
            if process is not None:
                with contextlib.suppress(Exception):
                    process.stop(timeout=10)
        if self.sentinel is not None:
            self.sentinel.stop()
        self.progress("multi-engine stack stopped")

    def __enter__(self) -> MultiStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
