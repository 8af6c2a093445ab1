"""Forwarding to the OpenAI-compatible upstream (vLLM): headers, errors, cancellation.

The response is relayed by :class:`RelayResponse`, an ASGI response that pumps upstream bytes
to the client as they arrive (SSE chunks are flushed one by one, unchanged) while listening for
the client's disconnect, so a client that goes away cancels the upstream request even while the
upstream is silent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tenure.service.api.upstream.client import UpstreamError, UpstreamResponse

__all__ = [
    "STREAM_CLIENT_GONE",
    "STREAM_DONE",
    "STREAM_UPSTREAM_CUT",
    "ClientGone",
    "ProxiedResponse",
    "RelayResponse",
    "UpstreamFailure",
    "forward_headers",
    "response_headers",
    "send_or_disconnect",
    "upstream_failure",
]

T = TypeVar("T")
_encode = msgspec.json.Encoder().encode

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
_DROP_RESPONSE = frozenset(h.encode() for h in _HOP_BY_HOP | {"date", "server"})


class ClientGone(Exception):
    """The client disconnected before the upstream answered."""


def forward_headers(
    raw: Iterable[tuple[bytes, bytes]], authorization: str | None, *, drop_client_auth: bool
) -> list[tuple[bytes, bytes]]:
    """Request headers for upstream: hop-by-hop and ``X-Tenure-*`` removed, auth replaced.

    ``drop_client_auth``: the caller's ``Authorization`` (or ``x-api-key``) is a tenant key of
    the sidecar's, never the upstream's to see (``authorization`` then replaces it, or nothing
    does).
    """
    out = []
    drop_auth = authorization is not None or drop_client_auth
    for name, value in raw:
        lowered = name.lower()
        if lowered in _HOP_BY_HOP_BYTES or lowered.startswith(b"x-tenure-"):
            continue
        if drop_auth and lowered in _CLIENT_AUTH:
            continue
        out.append((name, value))
    if authorization is not None:
        out.append((b"authorization", authorization.encode()))
    return out


_HOP_BY_HOP_BYTES = frozenset(h.encode() for h in _HOP_BY_HOP)
#: A caller's credentials: ``x-api-key`` is the Anthropic clients' spelling of the bearer key.
_CLIENT_AUTH = frozenset({b"authorization", b"x-api-key"})


def response_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers for the client, in ASGI form (lower-case names), without
    hop-by-hop ones (and without ``content-length``: the response sets its own)."""
    out = []
    for name, value in headers:
        lowered = name.lower()
        if lowered not in _DROP_RESPONSE:
            out.append((lowered, value))
    return out


class _RelayedHeaders(Response):
    """A response whose headers are already in ASGI form (as :func:`response_headers` gives).

    Starlette's ``Response.__init__`` would re-encode and re-scan every header of every
    proxied answer; these skip it.
    """

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status_code = status_code
        self.body = body
        self.background = None
        self.raw_headers = headers


class ProxiedResponse(_RelayedHeaders):
    """A whole upstream answer. ``on_sent`` runs once the answer is handed to the server (or
    sending it failed): the proxy's bookkeeping waits until then instead of delaying it."""

    def __init__(
        self,
        content: bytes,
        status_code: int,
        headers: list[tuple[bytes, bytes]],
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        if not (status_code < 200 or status_code in (204, 304)):
            headers.append((b"content-length", str(len(content)).encode()))
        super().__init__(status_code, headers, content)
        self._on_sent = on_sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, headers = self.status_code, self.raw_headers
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            if self._on_sent is not None:
                self._on_sent()


@dataclass(frozen=True, slots=True)
class UpstreamFailure:
    """What the client is told when the upstream never answered (in its route's format)."""

    status: int
    message: str
    #: The error's ``code`` (and OpenAI ``type``): ``upstream_timeout`` or ``upstream_unreachable``.
    code: str
    #: The metric label (``tenure_upstream_errors_total{kind=...}``).
    kind: str


def upstream_failure(exc: UpstreamError) -> UpstreamFailure:
    """504 for a timed-out upstream, 502 for an unreachable one."""
    if exc.kind == "timeout":
        return UpstreamFailure(
            504, "the model server did not answer in time", "upstream_timeout", "timeout"
        )
    return UpstreamFailure(
        502,
        f"the model server is unreachable ({exc.detail})",
        "upstream_unreachable",
        "unreachable",
    )


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


#: The disconnect watcher starts only once the upstream has taken this long: most answers
#: that come sooner are whole before a watcher could matter, and it costs a task per request.
_WATCH_AFTER_S = 0.02


async def send_or_disconnect(work: Awaitable[T], receive: Receive) -> T:
    """Await ``work`` unless the client disconnects first (then cancel it, raise ClientGone).

    ``work`` runs in the calling task; one watcher task, started after ``_WATCH_AFTER_S``,
    cancels that task if the client goes away. (Running ``work`` as a second task and waiting
    on both costs two task creations and an ``asyncio.wait`` per request, a visible share of
    the proxy's CPU.) A client gone sooner is noticed when the watcher starts.
    """
    loop = asyncio.get_running_loop()
    current = asyncio.current_task(loop)
    assert current is not None
    gone = False
    watcher: asyncio.Task[None] | None = None

    async def watch() -> None:
        nonlocal gone
        await _wait_disconnect(receive)
        gone = True
        current.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(watch())

    timer = loop.call_later(_WATCH_AFTER_S, start_watching)
    try:
        result = await work
    except asyncio.CancelledError:
        if not gone:
            raise  # cancelled from outside (shutdown): not ours to swallow
        # Our own cancellation: take it back so the task is not left marked cancelling.
        if current.uncancel() > 0:
            raise
        raise ClientGone from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()
    if gone:  # ``work`` absorbed the cancellation and finished anyway
        current.uncancel()
        raise ClientGone
    return result


#: How a relayed stream ended (``RelayResponse``'s ``on_complete`` argument).
STREAM_DONE = "done"
STREAM_CLIENT_GONE = "client_gone"
STREAM_UPSTREAM_CUT = "upstream_cut"


def stream_cut_reason(exc: UpstreamError) -> tuple[str, str]:
    """``(message, code)`` for a stream the upstream broke."""
    if exc.kind == "timeout":
        return "the model server stopped sending in time", "upstream_timeout"
    return "the model server ended the stream early", "upstream_unreachable"


class RelayResponse(_RelayedHeaders):
    """Stream an upstream response through, chunk by chunk, cancellable by disconnect.

    ``on_chunk`` sees every chunk (the proxy scans them for the finish reason);
    ``on_complete(outcome, error)`` runs once at the end: :data:`STREAM_DONE`,
    :data:`STREAM_CLIENT_GONE`, or :data:`STREAM_UPSTREAM_CUT` with the upstream's error (the
    client was sent ``error_event(error)``, the route's own end of a cut stream, then).
    """

    def __init__(
        self,
        upstream: UpstreamResponse,
        *,
        status_code: int,
        headers: list[tuple[bytes, bytes]],
        on_chunk: Callable[[bytes], None] | None = None,
        on_complete: Callable[[str, UpstreamError | None], None] | None = None,
        error_event: Callable[[UpstreamError], bytes],
    ) -> None:
        super().__init__(status_code, headers, b"")  # streamed: no content-length
        self._upstream = upstream
        #: The route's own way of ending a cut stream (its shape's ``stream_error``).
        self._error_event = error_event
        self._on_chunk = on_chunk
        self._on_complete = on_complete
        self._error: UpstreamError | None = None

    async def _pump(self, send: Send) -> str:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        chunks: AsyncIterator[bytes] = self._upstream.chunks()
        try:
            async for chunk in chunks:
                if self._on_chunk is not None:
                    self._on_chunk(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            # The upstream died mid-stream and the status is already sent: say so in the
            # stream itself.
            self._error = exc
            await send({"type": "http.response.body", "body": self._error_event(exc)})
            return STREAM_UPSTREAM_CUT
        # The answer is whole: its turn ends now, before the stream's last frame lets the
        # client go on (a Responses client continues the answer at once, and the sidecar
        # must already know whose answer it is).
        self._complete(STREAM_DONE)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return STREAM_DONE

    def _complete(self, outcome: str) -> None:
        on_complete, self._on_complete = self._on_complete, None  # once
        if on_complete is not None:
            on_complete(outcome, self._error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = STREAM_CLIENT_GONE
        pump = asyncio.ensure_future(self._pump(send))
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        try:
            await asyncio.wait((pump, watcher), return_when=asyncio.FIRST_COMPLETED)
            if pump.done():
                watcher.cancel()
                with contextlib.suppress(OSError):
                    outcome = pump.result()
            else:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await pump
        finally:
            for task in (pump, watcher):
                if not task.done():
                    task.cancel()
            # Closing the upstream response drops its connection: vLLM sees the disconnect
            # and aborts the generation.
            await self._upstream.close()
            self._complete(outcome)
