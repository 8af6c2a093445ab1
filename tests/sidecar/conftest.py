"""Fixtures for sidecar tests: a real fake-vLLM upstream and the real sidecar, over HTTP."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from tenure.service.app import create_app
from tenure.service.settings import Settings
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread

ADMIN_TOKEN = "test-admin-token"

#: Settings for a sidecar that a long randomised test drives for minutes (the property and
#: schema fuzz tests): timeouts a loaded 2-core host meets. At the defaults (Redis 0.5 s,
#: the fixture's 5 s upstream read) an event loop starved for half a second counts an answered
#: Redis call as a timeout, opens the breaker and answers 503, or relays a 504 for the fake
#: engine: a 5xx those tests must count as a finding, made by the host's load, not the code.
#: The breaker and timeout behaviour itself is tested with its own settings elsewhere.
LOADED_HOST: dict[str, Any] = {"redis_timeout_s": 10.0, "upstream_read_timeout_s": 60.0}
#: The client timeout and the condition-wait cap to go with them, seconds.
LOADED_HOST_WAIT_S = 120.0
#: pytest-timeout for those tests: a hang guard, not a speed check (they take about 15 s and
#: 65 s on a quiet machine, and many times that beside a CPU-heavy job at load 40).
LOADED_HOST_TEST_TIMEOUT_S = 900


@pytest.fixture
def upstream() -> Iterator[tuple[FakeUpstream, ServerThread]]:
    fake = FakeUpstream()
    server = ServerThread(fake).start()
    try:
        yield fake, server
    finally:
        server.stop()


@pytest.fixture
def sidecar_factory(redis_url: str, upstream) -> Iterator[Callable[..., ServerThread]]:
    """Start sidecars (several may share one Redis) with settings overrides."""
    _fake, up = upstream
    started: list[ServerThread] = []

    def start(**overrides: Any) -> ServerThread:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "upstream_url": up.url,
            "admin_token": ADMIN_TOKEN,
            "push_addr": "",
            "refresh_interval_s": 0.2,
            "upstream_read_timeout_s": 5.0,
        }
        values.update(overrides)
        server = ServerThread(create_app(Settings(**values))).start()
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def sidecar(sidecar_factory: Callable[..., ServerThread]) -> ServerThread:
    return sidecar_factory()


@pytest.fixture
def client(sidecar: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sidecar.url, timeout=10) as http:
        yield http
