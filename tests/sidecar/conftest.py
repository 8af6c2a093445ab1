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
