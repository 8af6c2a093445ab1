"""The raw upstream client against real sockets: framing, keep-alive, stale connections, errors.

Each test runs a small asyncio TCP server that answers with exact bytes, so the cases the proxy's
integration tests cannot easily provoke (a pooled connection the server already closed, a body
delimited by the close of the connection, a response that does not parse) are covered here.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.connection import Connection

from tenure.service.api.upstream.client import UpstreamError
from tenure.service.api.upstream.raw import RawUpstream
from tenure.service.state.connection import HiredisPackedConnection

_Handler = Callable[["_Server", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class _Server:
    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[bytes] = []
        self.closed = asyncio.Event()
        #: Set when the server has closed a connection from its side.
        self.server_closed = asyncio.Event()


@asynccontextmanager
async def _serve(handler: _Handler) -> AsyncIterator[tuple[_Server, str]]:
    state = _Server()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            await handler(state, reader, writer)
        except asyncio.CancelledError:
            pass  # the test is over and the server shuts down
        finally:
            writer.close()
            state.server_closed.set()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield state, f"http://127.0.0.1:{port}"


async def _read_request(state: _Server, reader: asyncio.StreamReader) -> bool:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        state.closed.set()
        return False
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    state.requests.append(head + await reader.readexactly(length))
    return True


def _ok(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n%s" % (len(body), extra, body)


def _client(url: str, read_timeout_s: float = 2.0) -> RawUpstream:
    return RawUpstream(url, connect_timeout_s=2.0, read_timeout_s=read_timeout_s, max_connections=4)


async def _get(client: RawUpstream, path: str = "/v1/models") -> tuple[int, bytes]:
    response = await client.send("POST", path, [(b"content-type", b"application/json")], b"{}")
    try:
        return response.status, await response.read()
    finally:
        await response.close()


async def test_keep_alive_reuses_one_connection() -> None:
    async def handler(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        while await _read_request(state, reader):
            writer.write(_ok(b'{"n": %d}' % len(state.requests)))

    async with _serve(handler) as (state, url):
        client = _client(url)
        assert await _get(client) == (200, b'{"n": 1}')
        assert await _get(client) == (200, b'{"n": 2}')
        await client.aclose()
    assert state.connections == 1
    first = state.requests[0]
    assert first.startswith(b"POST /v1/models HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"content-length: 2\r\n" in first and first.endswith(b"\r\n\r\n{}")


async def test_a_pooled_connection_closed_by_the_server_is_resent_on_a_new_one() -> None:
    async def handler(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        if await _read_request(state, reader):
            writer.write(_ok(b"ok"))  # keep-alive by HTTP/1.1 default, then closes anyway
            await writer.drain()

    async with _serve(handler) as (state, url):
        client = _client(url)
        assert await _get(client) == (200, b"ok")
        # The server has closed the pooled connection: the next request finds it dead.
        await asyncio.wait_for(state.server_closed.wait(), 10)
        assert await _get(client) == (200, b"ok")
        await client.aclose()
    assert state.connections == 2


async def test_chunked_and_close_delimited_bodies_stream_chunk_by_chunk() -> None:
    async def handler(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await _read_request(state, reader)
        if len(state.requests) == 1 and state.connections == 1:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n"
                         b"content-type: text/event-stream\r\n\r\n")  # fmt: skip
            for event in (b"data: 1\n\n", b"data: [DONE]\n\n"):
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.02)
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()

    async with _serve(handler) as (_state, url):
        client = _client(url)
        response = await client.send("POST", "/v1/chat/completions", [], b"{}")
        assert response.header("Content-Type") == "text/event-stream"
        chunks = [chunk async for chunk in response.chunks()]
        await response.close()
        assert chunks == [b"data: 1\n\n", b"data: [DONE]\n\n"]  # one event per chunk, unframed
        assert await _get(client) == (200, b"until the end")
        await client.aclose()


async def test_silence_is_a_timeout_and_abandoning_a_response_drops_its_connection() -> None:
    async def handler(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await _read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        await writer.drain()
        await _read_request(state, reader)  # returns when the client drops the connection

    async with _serve(handler) as (state, url):
        client = _client(url, read_timeout_s=0.2)
        response = await client.send("POST", "/x", [], b"")
        with pytest.raises(UpstreamError) as raised:
            await response.read()
        assert raised.value.kind == "timeout"
        await response.close()
        await asyncio.wait_for(state.closed.wait(), 2.0)  # the upstream saw the disconnect
        await client.aclose()


async def test_refused_cut_and_garbage_answers_are_unreachable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    client = _client(f"http://127.0.0.1:{port}")
    with pytest.raises(UpstreamError) as raised:
        await _get(client)
    assert raised.value.kind == "unreachable"

    async def cut(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await _read_request(state, reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\nshort")

    async def garbage(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await _read_request(state, reader)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.5)

    for handler in (cut, garbage):
        async with _serve(handler) as (_state, url):
            client = _client(url)
            with pytest.raises(UpstreamError) as raised:
                await _get(client)
            assert raised.value.kind == "unreachable"
            await client.aclose()


async def test_paths_are_percent_encoded_once_and_the_base_path_is_kept() -> None:
    async def handler(state: _Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        await _read_request(state, reader)
        writer.write(_ok(b""))

    async with _serve(handler) as (state, url):
        client = _client(url + "/prefix")
        await _get(client, "/v1/files/a b%2Fc?x=1&y=ü")
        await client.aclose()
    assert state.requests[0].startswith(b"POST /prefix/v1/files/a%20b%2Fc?x=1&y=%C3%BC HTTP/1.1")


def test_bad_upstream_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="upstream URL"):
        RawUpstream("ftp://x", connect_timeout_s=1, read_timeout_s=1, max_connections=1)


@pytest.mark.parametrize(
    "args",
    [
        ("EVALSHA", "a" * 40, 2, "tenure:s:acme:x", b"k2", 1.5, 1764500000.123456, "ü", -3),
        ("CONFIG GET", "maxmemory"),
        (b"CLIENT SETNAME", "tenure"),
        ("SET", "k", memoryview(b"value")),
    ],
)
def test_hiredis_packing_is_byte_identical_to_redis_py(args: tuple[Any, ...]) -> None:
    ours = b"".join(bytes(p) for p in HiredisPackedConnection().pack_command(*args))
    theirs = b"".join(bytes(p) for p in Connection().pack_command(*args))
    assert ours == theirs


async def test_hiredis_packed_connection_talks_to_real_redis(redis_url: str) -> None:
    client = aioredis.Redis.from_url(redis_url, connection_class=HiredisPackedConnection)
    try:
        assert isinstance(client.connection_pool.connection_class(), HiredisPackedConnection)
        await client.set("tenure-test:packed", "ü" * 3)
        assert await client.get("tenure-test:packed") == "üüü".encode()
        with pytest.raises(Exception, match="Invalid input"):
            await client.set("tenure-test:bool", True)
    finally:
        await client.delete("tenure-test:packed")
        await client.aclose()
