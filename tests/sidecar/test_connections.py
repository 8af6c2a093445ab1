"""Client connections are bounded (issue 10, hole 9): ``tenure serve`` as deployed.

The sidecar runs as its own process (``python -m tenure.service.cli serve``) with a small
file-descriptor limit, so a flood of idle and half-sent connections would exhaust it as it
would a production process. Legitimate requests must keep succeeding, and connections that
send nothing, half a head or half a body are closed after the configured deadlines.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import RedisProcess
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread, free_port

FD_LIMIT = 256
CHAT = "/v1/chat/completions"
BODY = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def served(redis_server: RedisProcess) -> Iterator[tuple[str, FakeUpstream]]:
    fake = FakeUpstream()
    engine = ServerThread(fake).start()
    port = free_port()
    env = {
        **os.environ,
        "TENURE_PORT": str(port),
        "TENURE_UPSTREAM_URL": engine.url,
        "TENURE_REDIS_URL": redis_server.url,
        "TENURE_REDIS_PREFIX": "conn-test",
        "TENURE_ADMIN_TOKEN": "connections-test-token",
        "TENURE_PUSH_ADDR": "",
        "TENURE_HTTP_HEADER_TIMEOUT_S": "1",
        "TENURE_HTTP_BODY_TIMEOUT_S": "1",
        "TENURE_HTTP_KEEPALIVE_TIMEOUT_S": "1",
        "TENURE_HTTP_MAX_HEADER_BYTES": "8192",
    }

    def small_fd_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))

    process = subprocess.Popen(
        [sys.executable, "-m", "tenure.service.cli", "serve", "--log-level", "warning"],
        env=env, preexec_fn=small_fd_limit, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "tenure serve did not start"
            time.sleep(0.1)
        yield url, fake
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        engine.stop()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """True once the server closed ``sock`` (EOF or reset) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def test_idle_and_half_open_floods_do_not_lock_out_requests(served) -> None:
    url, fake = served
    port = _port(url)
    flood: list[socket.socket] = []
    try:
        # Far more connections than the process has descriptors: silent ones, half a head,
        # half a body.
        for i in range(2 * FD_LIMIT):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if i % 3 == 1:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            elif i % 3 == 2:
                sock.sendall(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                    b"content-type: application/json\r\ncontent-length: 1000\r\n\r\n{"
                )
            flood.append(sock)
        before = len(fake.received)
        with httpx.Client(base_url=url, timeout=10) as http:
            for _ in range(20):
                assert http.post(CHAT, json=BODY).status_code == 200
        with httpx.Client(
            base_url=url, timeout=10, limits=httpx.Limits(max_keepalive_connections=0)
        ) as http:
            for _ in range(20):  # a fresh connection each
                assert http.post(CHAT, json=BODY).status_code == 200
        # The half-sent requests never reached the engine.
        assert len(fake.received) - before == 40
    finally:
        for sock in flood:
            sock.close()


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connects and says nothing
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\n",  # half a head
        b"G",  # one byte
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{",
    ],
)
def test_silent_and_half_sent_connections_are_closed(served, sent: bytes) -> None:
    url, fake = served
    before = len(fake.received)
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
        if sent:
            sock.sendall(sent)
        # 1 s deadline, checked every second: closed well within 5 s, never held.
        assert _closed_within(sock, 5.0)
    assert len(fake.received) == before


def test_a_slow_drip_head_is_closed_despite_activity(served) -> None:
    """A byte every half second keeps the connection busy but never completes the head."""
    url, _ = served
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
        started = time.monotonic()
        closed = False
        for byte in b"GET /v1/models HTTP/1.1\r\nhost: xxxxxxxxxxxxxxxxxxxxxxxx\r\n":
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed_within(sock, 0.5):
                closed = True
                break
        assert closed and time.monotonic() - started < 10


def test_idle_keep_alive_connection_is_closed_after_its_timeout(served) -> None:
    url, _ = served
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        assert b"200 OK" in sock.recv(65536)
        assert _closed_within(sock, 5.0)


def test_an_oversized_head_is_refused(served) -> None:
    url, fake = served
    before = len(fake.received)
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 20_000 + b"\r\n\r\n")
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 431") or answer == b""
    assert len(fake.received) == before
    # A large body is not a large head.
    with httpx.Client(base_url=url, timeout=10) as http:
        big = {**BODY, "messages": [{"role": "user", "content": "x" * 200_000}]}
        assert http.post(CHAT, json=big).status_code == 200
