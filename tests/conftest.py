"""Root fixtures shared by every test package: a real ``redis-server``.

* ``redis_server`` (session scope): one real ``redis-server`` on a free loopback port, in a temp
  dir, persistence off; stopped at the end of the session.
* ``redis_url`` (function scope): the URL of that server with every database flushed first, so
  each test starts from a clean database.
* ``redis_process_factory`` (function scope): private servers a test may kill and restart
  (``stop()`` / ``start()`` keep the port), for fault tests; all stopped after the test.
* ``sentinel_group`` (function scope): master + replica + three Sentinels
  (:class:`tenure.service.processes.redis_groups.SentinelGroup`); ``redis_cluster`` (module scope):
  three cluster masters (:class:`tenure.service.processes.redis_groups.ClusterGroup`).

Nothing is faked here: tests that use Redis talk to the real server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis

from tenure.service.processes import free_port, redis_argv, redis_executable
from tenure.service.processes.redis_groups import ClusterGroup, SentinelGroup

__all__ = ["RedisProcess", "free_port", "poll", "wait_for"]

T = TypeVar("T")


def poll(predicate: Callable[[], T], timeout_s: float = 5.0, interval_s: float = 0.02) -> T:
    """The one polling loop of the tests: ``predicate()`` until it is truthy or time is up;
    returns its last value (falsy on a timeout). Tests wait on the thing they need, never sleep
    for it."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def load_stretch() -> float:
    """How much longer than on a quiet machine a wait may take now: the 1-minute load average
    per CPU, between 1 and 4. CI runs on a 2-core machine that may be busy (a real-CLI engine
    test missed its 30 s settle wait at load ~20 beside two other engines, issue 23)."""
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 1.0
    return min(4.0, max(1.0, per_cpu))


def wait_for(predicate: Callable[[], T], timeout_s: float = 5.0, interval_s: float = 0.02) -> T:
    """Poll ``predicate`` until it returns something truthy, and return that. The timeout is a
    hang guard, stretched by :func:`load_stretch` (a wait that is met costs nothing extra)."""
    value = poll(predicate, timeout_s * load_stretch(), interval_s)
    if not value:
        raise AssertionError("condition not reached")
    return value


class RedisProcess:
    """One ``redis-server`` child process; ``stop()`` then ``start()`` reuses the same port.

    Persistence is off by default (no RDB, no AOF), so a killed server comes back empty;
    ``persistent=True`` keeps an fsync-always AOF so it comes back with its data.
    """

    def __init__(self, port: int | None = None, *, persistent: bool = False) -> None:
        executable = redis_executable()
        if executable is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.executable = executable
        self.host = "127.0.0.1"
        self.port = port if port is not None else free_port()
        # A port chosen by us may be re-picked if another process grabs it first; once the
        # server has run on a port (or the caller fixed it), restarts must keep it.
        self._port_fixed = port is not None
        # Persistent servers fsync every write to an append-only file, so a killed server
        # comes back with everything it acknowledged (fault tests check nothing is lost).
        self.persistent = persistent
        self._tmp = tempfile.TemporaryDirectory(prefix="tenure-redis-")
        self.directory = Path(self._tmp.name)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 10.0) -> RedisProcess:
        if self.running:
            return self
        for _attempt in range(5):
            self._process = subprocess.Popen(
                redis_argv(self.executable, self.port, self.directory, persistent=self.persistent),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready(timeout_s):
                self._port_fixed = True
                return self
            self._kill()
            if not self._port_fixed:
                self.port = free_port()
        raise RuntimeError(f"redis-server did not become ready on 127.0.0.1:{self.port}")

    def _wait_ready(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.RedisError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def stop(self) -> None:
        """Kill the server abruptly (SIGKILL), as a crash would."""
        self._kill()

    def close(self) -> None:
        self._kill()
        self._tmp.cleanup()

    def flush(self) -> None:
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=5)
        try:
            client.flushall()
        finally:
            client.close()


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A terminated run stops its servers: SIGTERM (a CI job's timeout, ``kill``) interrupts
    the session like Ctrl-C, so pytest tears every fixture down (redis-server, sidecars, vLLM
    engines) instead of dying at once and leaving them running as orphans."""
    del config
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupted)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisProcess]:
    server = RedisProcess().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_url(redis_server: RedisProcess) -> str:
    """A clean database on the shared server (everything flushed before the test)."""
    if not redis_server.running:
        # A test that stopped the shared server must not break the ones after it.
        redis_server.start()
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def redis_process_factory() -> Iterator[Callable[..., RedisProcess]]:
    """Private, killable servers for fault tests; each is stopped and removed afterwards."""
    made: list[RedisProcess] = []

    def make(*, persistent: bool = False) -> RedisProcess:
        server = RedisProcess(persistent=persistent).start()
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            server.close()


@pytest.fixture
def sentinel_group(tmp_path: Path) -> Iterator[SentinelGroup]:
    """A real master + replica + three Sentinels (failover after 1 s of silence); stopped after."""
    with SentinelGroup(tmp_path / "sentinel") as group:
        yield group


@pytest.fixture(scope="module")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGroup]:
    """A real three-master Redis Cluster (``redis-cli --cluster create``); stopped after."""
    with ClusterGroup(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster
