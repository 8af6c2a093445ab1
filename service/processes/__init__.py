"""Local child processes for the stack launcher, the benchmarks and the test fixtures.

One way to run a helper process on this machine: :class:`ManagedProcess` (its own process
group and log file, readiness polled, TERM then KILL on stop), one way to start
``redis-server`` (:func:`redis_argv` / :func:`start_redis`), and the small standard-library
HTTP helpers the launchers use to poll what they started (they must not need the web stack).
Everything binds 127.0.0.1. Imported by the top of the house only (``tenure.service.stack``,
``benchmarks``, tests); it imports nothing of the project.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ManagedProcess",
    "StackError",
    "free_port",
    "http_json",
    "http_ok",
    "listening",
    "redis_argv",
    "redis_executable",
    "redis_ping",
    "require_redis",
    "scrape",
    "start_redis",
]


class StackError(RuntimeError):
    """A local component failed to start or answer; the message names it and its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on ``127.0.0.1:port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def http_json(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> Any:
    """One JSON request (standard library only: the launcher must not need the web stack).

    A 503 with ``Retry-After`` (the sidecar's answer while its Redis is away or failing over)
    is retried after the delay it names, for up to ``timeout`` seconds in all: the API's
    contract, kept by its own client.
    """
    data = None if body is None else json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
            return json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            delay = _retry_after(exc)
            if delay is None or time.monotonic() + delay > deadline:
                raise
            exc.close()
            time.sleep(delay)


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    return retry_after_s(exc.code, exc.headers.get("Retry-After"))


def retry_after_s(status: int, retry_after: str | None) -> float | None:
    """The delay a 503 asks for (at least 50 ms, at most 5 s), or None for anything else."""
    if status != 503:
        return None
    try:
        return min(5.0, max(0.05, float(retry_after or "")))
    except ValueError:
        return None


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

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the log, on one line (for an error message)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

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


# --- redis-server --------------------------------------------------------------------------


def redis_executable() -> str | None:
    """The ``redis-server`` on PATH, or ``None`` (each caller words the error its own way)."""
    return shutil.which("redis-server")


def require_redis() -> str:
    """The ``redis-server`` on PATH, or :class:`StackError` saying how to install it."""
    found = redis_executable()
    if found is None:
        raise StackError("redis-server not found on PATH (Debian: apt-get install redis-server)")
    return found


def redis_argv(
    executable: str,
    port: int,
    directory: Path,
    *,
    persistent: bool = False,
    sentinel_config: Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """A loopback ``redis-server`` on ``port`` with its files in ``directory``.

    No RDB snapshots; ``persistent`` keeps an fsync-always append-only file, so a killed
    server comes back with everything it acknowledged (what fault tests check).
    ``sentinel_config``: a Sentinel (``redis-server CONF --sentinel``) with that config file,
    which it rewrites as it learns the topology, instead of a data node. ``extra``: more
    directives (``--replicaof``, the cluster's), after these.
    """
    if sentinel_config is not None:
        head = [executable, str(sentinel_config), "--sentinel"]
        data: list[str] = []
    else:
        head = [executable]
        data = [
            "--save", "",
            "--appendonly", "yes" if persistent else "no",
            "--appendfsync", "always",
            "--protected-mode", "yes",
        ]  # fmt: skip
    return [
        *head,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--dir", str(directory),
        *data,
        "--daemonize", "no",
        "--loglevel", "warning",
        *extra,
    ]  # fmt: skip


def redis_ping(port: int) -> bool:
    """Whether the server on ``port`` answers ``PING`` (plain socket: no client library)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def start_redis(
    port: int, directory: Path, log_path: Path, *, timeout: float = 20.0
) -> ManagedProcess:
    """Start a ``redis-server`` as a :class:`ManagedProcess` and wait until it answers."""
    executable = require_redis()
    directory.mkdir(parents=True, exist_ok=True)
    managed = ManagedProcess("redis-server", redis_argv(executable, port, directory), log_path)
    managed.start()
    try:
        managed.wait_until(lambda: redis_ping(port), timeout)
    except BaseException:
        managed.stop(timeout=5, kill=True)
        raise
    return managed
