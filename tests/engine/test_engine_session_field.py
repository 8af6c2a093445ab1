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

from tenure.service.processes import free_port, http_json
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
    """The test stack with vLLM's KV events published on ``events_port``."""

    def __init__(self, config: StackConfig, events_port: int) -> None:
        super().__init__(config)
        self.events_port = events_port

    def engine_argv(self) -> list[str]:
        events = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{self.events_port}",
            "topic": "kv",
        }
        return [*super().engine_argv(), "--kv-events-config", json.dumps(events)]

    def sidecar_env(self) -> dict[str, str]:
        tenants = {key: {"name": name} for name, key in KEYS.items()}
        return {**super().sidecar_env(), "TENURE_TENANTS": json.dumps(tenants)}


class _Events:
    """Subscribes to the engine's KV events; collects the session ids of BlockStored."""

    def __init__(self, port: int) -> None:
        import zmq

        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVTIMEO, 200)
        self._sock.connect(f"tcp://127.0.0.1:{port}")
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
    local = _EventsStack(config, free_port())
    local.start()
    events = _Events(local.events_port)
    yield local, events
    events.close()
    local.stop()


def _send(stack: LocalStack, route: str, tenant: str, seed: int) -> None:
    """One tracked request on ``route`` with the client's session id, as tenant ``tenant``."""
    prompt = word_prompt(seed, 300)  # two or more full 128-token blocks: BlockStored events
    headers = {"X-Tenure-Session": CLIENT_SESSION, "Authorization": f"Bearer {KEYS[tenant]}"}
    # A client's own session_id in the body must not reach the engine either.
    body: dict[str, Any] = {"model": "tiny", "session_id": CLIENT_SESSION}
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


@pytest.mark.skip(
    reason="issue 27, open: no KV event reached the subscriber from the CPU build "
    "(engine up, requests answered, zero BlockStored received; not diagnosed). It failed "
    "every run and cost ~5 minutes of CI as an xfail; the sidecar side is covered by "
    "tests/sidecar/test_router_headers.py against a recording upstream."
)
@pytest.mark.parametrize("route", ["chat", "completions", "messages", "responses"])
def test_every_tracked_route_reaches_vllm_with_the_tenant_scoped_session(
    stack: tuple[LocalStack, _Events], route: str
) -> None:
    local, events = stack
    seeds = {"chat": 1, "completions": 2, "messages": 3, "responses": 4}
    for tenant in KEYS:
        _send(local, route, tenant, seed=seeds[route] * 10 + len(tenant))
    alpha = engine_session_id("alpha", CLIENT_SESSION)
    beta = engine_session_id("beta", CLIENT_SESSION)
    assert alpha != beta
    # vLLM attached the sidecar's id for each tenant to the blocks the request stored.
    assert events.wait_for(alpha), (route, sorted({s for s in events.sessions if s}))
    assert events.wait_for(beta), (route, sorted({s for s in events.sessions if s}))
    # No client-chosen string reached the engine's own session field.
    assert CLIENT_SESSION not in events.sessions
    assert all(s is None or s.startswith("tnr-") for s in events.sessions)
