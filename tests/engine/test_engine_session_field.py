"""vLLM's own session field, seen from inside the CPU vLLM: its KV ``BlockStored`` events.

vLLM reads a request's session from the body's ``session_id`` (else ``X-Session-ID``) and
attaches it to the KV events of the blocks the request stores. The real stack (Redis,
``tenure serve`` with two tenants, the CPU vLLM publishing KV events over ZeroMQ) is driven on
every tracked route; the events must carry the sidecar's derived id for each request, and two
tenants' identical client session ids must reach the engine as different ids, neither of them
the client's raw value.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from tenure.service.processes import http_json
from tenure.service.stack import LocalStack, StackConfig
from tenure.service.tools.tiny_model import word_prompt
from tenure.service.wire.engine_session import engine_session_id
from tests.engine.conftest import model_cache_dir

pytestmark = [
    pytest.mark.engine,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.timeout(1200),  # the stack's start on a loaded machine is part of the first test
]

KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-0123456789"}
CLIENT_SESSION = "shared-client-session"


class _EventsStack(LocalStack):
    """The test stack with vLLM's KV events published to ``events_endpoint``."""

    def __init__(self, config: StackConfig, events_endpoint: str) -> None:
        super().__init__(config)
        self.events_endpoint = events_endpoint

    def engine_argv(self) -> list[str]:
        # vLLM's ZMQ publisher binds only wildcard / ipc endpoints and *connects* to a
        # host:port one (``ZmqEventPublisher._is_bind_endpoint``), so it connects to the
        # subscriber's bound loopback address. (Both connecting was why no event arrived.)
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.events_endpoint,
            "topic": "kv",
        }
        return [*super().engine_argv(), "--kv-events-config", json.dumps(events)]

    def sidecar_env(self) -> dict[str, str]:
        tenants = {key: {"name": name} for name, key in KEYS.items()}
        return {**super().sidecar_env(), "TENURE_TENANTS": json.dumps(tenants)}


class _Events:
    """Subscribes to the engine's KV events; collects the session ids of BlockStored.

    The subscriber binds (loopback, a port the OS picks) and the engine's publisher connects
    to it, before the engine starts, so no event of the test's requests can be missed.
    """

    def __init__(self) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVTIMEO, 200)
        self._sock.bind("tcp://127.0.0.1:0")
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.sessions: list[str | None] = []
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import msgspec
        import zmq
        from vllm.distributed.kv_events import BlockStored, KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while not self._stop.is_set():
            try:
                frames = self._sock.recv_multipart()
            except zmq.Again:
                continue
            batch = decoder.decode(frames[-1])
            stored = [e.session_id for e in batch.events if isinstance(e, BlockStored)]
            with self._cond:
                self.sessions.extend(stored)
                self._cond.notify_all()

    def wait_for(self, session: str, timeout: float = 60.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: session in self.sessions, timeout)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close(linger=0)
        self._ctx.term()


@pytest.fixture(scope="module")
def stack(redis_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    redis_server.flush()
    config = StackConfig(
        workdir=Path(tmp_path_factory.mktemp("stack-session-field")),
        model_cache=model_cache_dir(),
        external_redis_url=redis_server.url,
        engine_timeout_s=900,
    )
    events = _Events()
    local = _EventsStack(config, events.endpoint)
    try:
        local.start()
        yield local, events
    finally:
        local.stop()
        events.close()


def _client_session(route: str) -> str:
    # One client session id per route (the same for both tenants), so each route's test
    # waits for its own derived ids and cannot pass on an earlier route's events.
    return f"{CLIENT_SESSION}-{route}"


def _send(stack: LocalStack, route: str, tenant: str, seed: int) -> None:
    """One tracked request on ``route`` with the client's session id, as tenant ``tenant``."""
    prompt = word_prompt(seed, 300)  # two or more full 128-token blocks: BlockStored events
    client = _client_session(route)
    headers = {"X-Tenure-Session": client, "Authorization": f"Bearer {KEYS[tenant]}"}
    # A client's own session_id in the body must not reach the engine either.
    body: dict[str, Any] = {"model": "tiny", "session_id": client}
    if route == "chat":
        path = "/v1/chat/completions"
        body |= {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    elif route == "completions":
        path = "/v1/completions"
        body |= {"prompt": prompt, "max_tokens": 2}
    elif route == "messages":
        path = "/v1/messages"
        body.pop("session_id")  # not a field of the Messages API
        body |= {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2}
    else:
        path = "/v1/responses"
        body |= {"input": prompt, "max_output_tokens": 2, "store": False}
    http_json("POST", f"{stack.proxy_url}{path}", body, headers)


ROUTES = ("chat", "completions", "messages", "responses")


def test_the_routes_here_are_every_tracked_route() -> None:
    from tenure.service.api.proxy.pipeline import TRACKED

    assert {shape.name for shape in TRACKED} == set(ROUTES)


@pytest.mark.parametrize("route", ROUTES)
def test_every_tracked_route_reaches_vllm_with_the_tenant_scoped_session(
    stack: tuple[LocalStack, _Events], route: str
) -> None:
    local, events = stack
    seeds = {"chat": 1, "completions": 2, "messages": 3, "responses": 4}
    for tenant in KEYS:
        _send(local, route, tenant, seed=seeds[route] * 10 + len(tenant))
    alpha = engine_session_id("alpha", _client_session(route))
    beta = engine_session_id("beta", _client_session(route))
    assert alpha != beta
    # vLLM attached the sidecar's id for each tenant to the blocks the request stored.
    assert events.wait_for(alpha), (route, sorted({s for s in events.sessions if s}))
    assert events.wait_for(beta), (route, sorted({s for s in events.sessions if s}))
    # No client-chosen string reached the engine's own session field.
    assert _client_session(route) not in events.sessions
    assert all(s is None or s.startswith("tnr-") for s in events.sessions)
