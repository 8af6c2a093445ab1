"""The HTTP server of ``tenure serve``: uvicorn, with bounded client connections.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but it never times
out a connection that has not sent a whole request yet: one that connects and says nothing,
or sends half a request head or body and stops, is held forever, and enough of them use up the
process's file descriptors until legitimate requests fail. :class:`GuardedHttpTools` (uvicorn's
httptools protocol plus a guard) closes such connections after a bounded time and keeps the
number of open connections under a cap:

* a request head (request line and headers) must be complete within ``header_timeout_s`` of
  its first byte, or of the connection opening; a head over ``max_header_bytes`` is answered
  431 and the connection closed;
* once the head is in, the body must be complete within ``body_timeout_s``;
* at ``max_connections`` the connection that waited longest without a request in progress
  (idle, or a head still incomplete) is closed to make room, else the one whose body stalled
  longest; only when every connection carries a whole request in progress is the new one
  refused. So idle or half-sent connections can never lock out a request.

Deadlines are checked by one sweep a second over the connections, not by a timer per request:
the per-request cost is a few attribute writes and clock reads.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass, field
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["ConnectionLimits", "GuardedHttpTools", "guarded_protocol", "uvicorn_config"]

log = logging.getLogger(__name__)

#: File descriptors kept for everything but client connections (upstream, Redis, files).
_FD_RESERVE = 64
_SWEEP_S = 1.0
# Phases of a connection.
_WAITING, _HEAD, _BODY, _BUSY = "waiting", "head", "body", "busy"


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_header_bytes: int = 64 * 1024
    max_connections: int = 4096


@dataclass(slots=True)
class _Guard:
    """What all connections of one server share: the limits and the open connections."""

    limits: ConnectionLimits
    #: Insertion-ordered: the oldest first (dicts keep order; values unused).
    open: dict[GuardedHttpTools, None] = field(default_factory=dict)
    sweeping: asyncio.TimerHandle | None = None
    closed_idle: int = 0
    refused: int = 0
    timed_out: int = 0

    def admit(self, conn: GuardedHttpTools) -> bool:
        """Room for ``conn``: when full, closes the connection that waited longest without a
        request (idle or an incomplete head), else the request body stalled longest; False
        if every connection has a whole request in progress (then ``conn`` is refused)."""
        if len(self.open) >= self.limits.max_connections:
            victim = next((c for c in self.open if c.phase in (_WAITING, _HEAD)), None)
            if victim is None:
                uploading = [c for c in self.open if c.phase == _BODY]
                victim = min(uploading, key=_last_byte, default=None)
            if victim is None:
                self.refused += 1
                return False
            self.closed_idle += 1
            victim.drop()
        self.open[conn] = None
        return True

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        limits = self.limits
        for conn in list(self.open):
            since = now - conn.phase_since
            if (conn.phase == _HEAD and since > limits.header_timeout_s) or (
                conn.phase == _BODY and since > limits.body_timeout_s
            ):
                self.timed_out += 1
                conn.drop()
        self.sweeping = loop.call_later(_SWEEP_S, self.sweep, loop) if self.open else None


def _last_byte(conn: GuardedHttpTools) -> float:
    return conn.last_byte


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with the connection guard of this module.

    A subclass per server binds its guard (:func:`guarded_protocol`); uvicorn builds one
    instance per connection.
    """

    guard: _Guard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.phase = _HEAD  # the first request's head is due from now
        self.phase_since = self.last_byte = self.loop.time()
        self.head_bytes = 0
        super().connection_made(transport)
        guard = self.guard
        if not guard.admit(self):
            transport.abort()
            return
        if guard.sweeping is None:
            guard.sweeping = self.loop.call_later(_SWEEP_S, guard.sweep, self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.open.pop(self, None)
        super().connection_lost(exc)

    def drop(self) -> None:
        self.guard.open.pop(self, None)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        self.last_byte = now = self.loop.time()
        if self.phase == _WAITING:
            self.phase, self.phase_since, self.head_bytes = _HEAD, now, 0
        if self.phase == _HEAD:
            self.head_bytes += len(data)
        super().data_received(data)
        # Still no whole head: everything counted is head (a completed head resets the count,
        # so body bytes that came with it never count).
        if self.phase == _HEAD and self.head_bytes > self.guard.limits.max_header_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
            b"connection: close\r\n\r\n"
        )
        self.drop()

    def on_headers_complete(self) -> None:
        limit = self.guard.limits.max_header_bytes
        if self.head_bytes > limit:
            # A big read that holds the whole head (and maybe body): measure the head itself.
            size = len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers)
            if size > limit:
                self._refuse_head()
                # Stops the parser before the request starts (uvicorn only logs it).
                raise httptools.HttpParserError("request head too large")
        self.phase, self.phase_since, self.head_bytes = _BODY, self.loop.time(), 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self.phase = _BUSY
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.phase == _BUSY and (self.cycle is None or self.cycle.response_complete):
            # Idle until the next request's first byte (uvicorn's keep-alive timeout runs);
            # a pipelined request that just started keeps the connection busy.
            self.phase, self.phase_since = _WAITING, self.loop.time()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedHttpTools]:
    """A protocol class whose connections share one guard with these limits."""
    return type("GuardedHttpToolsProtocol", (GuardedHttpTools,), {"guard": _Guard(limits)})


def fd_capped(max_connections: int, upstream_connections: int) -> int:
    """``max_connections`` within this process's file-descriptor limit (raised to its hard
    limit first where allowed), leaving room for upstream and Redis connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + upstream_connections + _FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return max_connections
    room = soft - _FD_RESERVE - min(upstream_connections, soft // 4)
    return max(8, min(max_connections, room))


def uvicorn_config(app: Any, settings: Any, **overrides: Any) -> Any:
    """The uvicorn configuration ``tenure serve`` runs ``app`` with (``settings``: Settings)."""
    import uvicorn

    cap = fd_capped(settings.http_max_connections, settings.upstream_max_connections)
    if cap < settings.http_max_connections:
        log.warning(
            "serving at most %d client connections (TENURE_HTTP_MAX_CONNECTIONS=%d does not "
            "fit the file-descriptor limit)", cap, settings.http_max_connections,
        )  # fmt: skip
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        max_header_bytes=settings.http_max_header_bytes,
        max_connections=cap,
    )
    options: dict[str, Any] = {
        "host": settings.host,
        "port": settings.port,
        "http": guarded_protocol(limits),
        "timeout_keep_alive": settings.http_keepalive_timeout_s,
        "access_log": False,  # per-request logging costs more than the proxy itself
        "proxy_headers": False,  # client addresses are not used; skip the per-request middleware
        "server_header": False,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)
