"""A lean HTTP/1.1 client for the hop to the upstream: asyncio protocols + httptools' parser.

The hop is always the same shape (one local OpenAI-compatible server, keep-alive, JSON or SSE
responses), so a general-purpose client's features (redirects, cookies, proxies, header
normalisation, per-request objects) are pure cost there: with aiohttp the client side was
about a sixth of the sidecar's CPU per proxied request. This one writes the request in one
``transport.write`` and parses the response with ``httptools`` (the C parser uvicorn uses).

Behaviour the proxy relies on, as in the other clients of :mod:`tenure.service.api.upstream.client`:

* bytes are raw: no decompression; chunked transfer coding is removed (the ASGI server frames
  the body again towards the client);
* the body is a stream of chunks as they arrive (SSE events pass one by one); the socket stops
  reading while more than ``_HIGH_WATER`` bytes wait for a slow client;
* failures raise :class:`UpstreamError`: ``unreachable`` (refused, reset, cut mid-body, a
  response that does not parse) or ``timeout`` (connect, or no byte for ``read_timeout_s``);
* a response that is not read to its end, or a request that is cancelled (the client went
  away), closes its connection, so vLLM sees the disconnect and aborts the generation;
* a fully read keep-alive connection goes back to a LIFO pool; a pooled connection idle longer
  than ``keepalive_s`` (below uvicorn's default 5 s) is not reused, and a request whose reused
  connection turns out closed before any byte of an answer is sent once more on a new one.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from urllib.parse import quote, urlsplit

import httptools

from tenure.service.api.upstream.client import UpstreamError, UpstreamResponse

__all__ = ["RawUpstream"]

_HIGH_WATER = 256 * 1024
_SAFE_PATH = "/%:@!$&'()*+,;=-._~?"


class _Stale(Exception):
    """A reused connection was closed by the server before it answered (safe to resend)."""


class _Connection(asyncio.Protocol):
    """One upstream connection; parses one response at a time (no pipelining)."""

    loop: asyncio.AbstractEventLoop  # set in connection_made

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.complete = False
        self.error: UpstreamError | _Stale | None = None
        self.received_any = False
        self.headers_done = False
        self.framed = False  # content-length or chunked: the end is known without EOF
        self.keep_alive = False
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()  # once per connection, not per wait

    def data_received(self, data: bytes) -> None:
        self.received_any = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("unreachable", f"bad response from upstream ({exc})"))
            self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.complete or self.error is not None:
            self._wake()
            return
        if self.headers_done and not self.framed and exc is None:
            self.complete = True  # a body delimited by the close of the connection
        elif not self.received_any:
            self.error = _Stale()
        else:
            self.error = UpstreamError("unreachable", "upstream closed the connection mid-answer")
        self._wake()

    # --- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Read here: once the message is complete the parser no longer says.
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True
        for name, value in self.raw_headers:
            lowered = name.lower()
            if lowered == b"content-length" or (
                lowered == b"transfer-encoding" and b"chunked" in value.lower()
            ):
                self.framed = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # --- the proxy's side -----------------------------------------------------------------

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout_s: float) -> None:
        """Until something happens (headers, a chunk, the end, an error); times out."""
        loop = self.loop
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout_s, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def take(self) -> bytes:
        chunk = self.chunks.popleft()
        self.buffered -= len(chunk)
        if self.paused and self.buffered < _HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return chunk

    def reusable(self) -> bool:
        return (
            self.complete
            and not self.closed
            and self.error is None
            and self.keep_alive
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Response:
    def __init__(self, client: RawUpstream, conn: _Connection, read_timeout_s: float) -> None:
        self._client = client
        self._conn = conn
        self._timeout = read_timeout_s
        self._released = False
        self.status = conn.status
        self.headers = conn.raw_headers

    def header(self, name: str) -> str:
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers:
            if key.lower() == wanted:
                return value.decode("latin-1")
        return ""

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
                continue
            if conn.complete:
                return
            if conn.error is not None:
                raise _as_upstream_error(conn.error)
            try:
                await conn.wait(self._timeout)
            except TimeoutError:
                raise UpstreamError("timeout", "no data from upstream in time") from None

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def close(self) -> None:
        if self._released:
            return
        self._released = True
        conn = self._conn
        if conn.reusable() and not conn.chunks:
            self._client.release(conn)
        else:
            conn.abort()  # cut mid-body: the upstream must see the disconnect
            self._client.forget()


def _as_upstream_error(error: UpstreamError | _Stale) -> UpstreamError:
    if isinstance(error, _Stale):
        return UpstreamError("unreachable", "upstream closed the connection")
    return error


class RawUpstream:
    """An :class:`~tenure.service.api.upstream.client.UpstreamClient` over raw asyncio
    connections."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        max_connections: int,
        keepalive_s: float = 4.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream URL must be http(s)://host[:port][/prefix]: {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self._prefix = parts.path.rstrip("/")
        default_port = self._port == (443 if parts.scheme == "https" else 80)
        netloc = self._host if ":" not in self._host else f"[{self._host}]"
        self._host_header = (netloc if default_port else f"{netloc}:{self._port}").encode()
        self._connect_timeout = connect_timeout_s
        self._read_timeout = read_timeout_s
        self._keepalive = keepalive_s
        self._idle: list[_Connection] = []
        self._targets: dict[str, str] = {}
        self._slots = asyncio.Semaphore(max_connections)
        self._open = 0

    async def send(
        self, method: str, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        target = self._targets.get(path)
        if target is None:
            target = quote(self._prefix + path, safe=_SAFE_PATH)
            if len(self._targets) < 256:  # the completion routes, not every passthrough query
                self._targets[path] = target
        head = [f"{method} {target} HTTP/1.1\r\nhost: ".encode(), self._host_header]
        for name, value in headers:
            head += (b"\r\n", name, b": ", value)
        if body or method in ("POST", "PUT", "PATCH"):
            head += (b"\r\ncontent-length: ", str(len(body)).encode())
        head.append(b"\r\n\r\n")
        request = b"".join(head) + body
        conn, reused = await self._acquire()
        try:
            return await self._exchange(conn, request)
        except _Stale:
            if not reused:
                conn.abort()
                self.forget()
                raise UpstreamError("unreachable", "upstream closed the connection") from None
        except BaseException:
            conn.abort()
            self.forget()
            raise
        # The pooled connection had been closed by the server: one fresh attempt.
        self.forget()
        conn, _ = await self._acquire(fresh=True)
        try:
            return await self._exchange(conn, request)
        except BaseException as exc:
            conn.abort()
            self.forget()
            if isinstance(exc, _Stale):
                raise UpstreamError("unreachable", "upstream closed the connection") from None
            raise

    async def _exchange(self, conn: _Connection, request: bytes) -> _Response:
        assert conn.transport is not None
        conn.transport.write(request)
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            if conn.closed:
                raise UpstreamError("unreachable", "upstream closed the connection")
            try:
                await conn.wait(self._read_timeout)
            except TimeoutError:
                raise UpstreamError("timeout", "no answer from upstream in time") from None
        return _Response(self, conn, self._read_timeout)

    async def _acquire(self, fresh: bool = False) -> tuple[_Connection, bool]:
        now = time.monotonic()
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed and now - conn.idle_since < self._keepalive:
                conn._reset()
                return conn, True
            conn.abort()
            self.forget()
        await self._slots.acquire()
        self._open += 1
        try:
            _, protocol = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(
                    _Connection, self._host, self._port, ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                ),
                self._connect_timeout,
            )  # fmt: skip
        except BaseException as exc:
            self.forget()
            if isinstance(exc, TimeoutError):
                raise UpstreamError("timeout", "connecting to upstream timed out") from None
            if isinstance(exc, OSError):
                raise UpstreamError("unreachable", type(exc).__name__) from None
            raise
        return protocol, False

    def release(self, conn: _Connection) -> None:
        """A fully read keep-alive connection goes back to the pool (it keeps its slot)."""
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def forget(self) -> None:
        """A connection was closed: its slot is free again."""
        if self._open > 0:
            self._open -= 1
            self._slots.release()

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().abort()
            self.forget()
