"""The hot path's Redis scripts over one pipelined connection: asyncio protocol + hiredis.

The proxy makes two script calls per request (``turn_start`` before forwarding, ``apply`` after
the answer). Through redis-py's asyncio client each call checks a connection out of the pool,
arms a timeout context, packs, writes, reads and returns it, and the sidecar's profile showed
that machinery costing more than the proxying itself. Redis answers the commands of one
connection in order, so a single connection can carry every call at once: each call writes its
``EVALSHA`` as soon as it is made and waits for its own reply, matched first in, first out.
Calls made together share the socket's writes and reads without any batching step.

Failure behaviour matches the client it replaces (the :class:`~tenure.service.state.breaker.Breaker`
sees the same exceptions): no connection or a lost one raises ``redis.exceptions.ConnectionError``
for every call in flight; a call with no reply within ``timeout_s`` raises
``redis.exceptions.TimeoutError`` and drops the connection (later replies could no longer be
matched to their calls); the next call reconnects. A script missing from the server's cache
(a restarted Redis) is sent once with ``EVAL``, which also caches it again. Error replies are
``redis.exceptions.ResponseError``, raised to the caller that got them only.

Only plain TCP connections are multiplexed; unix-socket and TLS URLs and Redis Cluster keep
redis-py (:meth:`MultiplexedScripts.for_client` returns ``None``). Behind Sentinel the master's
address is asked of the Sentinels on every (re)connect, and a ``READONLY`` reply (the server was
demoted by a failover) drops the connection like a lost one, so the next call reaches the new
master.

``wait_replicas`` > 0 follows each script with ``WAIT n timeout`` on the same connection (so it
covers that script's writes): the call returns once ``n`` replicas acknowledged them or the
timeout passed; ``on_short_wait`` is told when fewer did (the write stands on the master).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import hiredis
import redis.asyncio as aioredis
from redis._parsers.base import BaseParser
from redis.asyncio.connection import Connection, SSLConnection
from redis.asyncio.sentinel import SentinelConnectionPool
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ConnectionError,
    InvalidResponse,
    NoScriptError,
    ReadOnlyError,
    ResponseError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from tenure.service.state.connection import pack_command

__all__ = ["MultiplexedScripts"]

#: Where to connect, asked again on every (re)connect (Sentinel: the current master).
Resolver = Callable[[], Awaitable[tuple[str, int]]]


class _Protocol(asyncio.Protocol):
    loop: asyncio.AbstractEventLoop  # set in connection_made

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader(protocolError=InvalidResponse, replyError=ResponseError)
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.loop = asyncio.get_running_loop()  # once, not per call (a getpid() each)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                waiter = self.waiting.popleft()
                if not waiter.done():  # a timed-out call's reply is read and dropped
                    waiter.set_result(reply)
        except (InvalidResponse, IndexError) as exc:
            self.fail(ConnectionError(f"unreadable reply from Redis ({exc})"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail_waiting(ConnectionError("connection to Redis lost"))

    def send(self, payload: bytes) -> asyncio.Future[Any]:
        assert self.transport is not None
        waiter: asyncio.Future[Any] = self.loop.create_future()
        self.transport.write(payload)
        self.waiting.append(waiter)
        return waiter

    def fail(self, error: Exception) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._fail_waiting(error)

    def _fail_waiting(self, error: Exception) -> None:
        while self.waiting:
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_exception(error)


class MultiplexedScripts:
    """``call(script, keys, args)`` like :class:`~tenure.service.state.batcher.ScriptBatcher`."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 0.5,
        connect_timeout_s: float = 0.5,
        resolve: Resolver | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
        on_short_wait: Callable[[int], None] | None = None,
    ) -> None:
        self._resolve = resolve
        self._wait = ("WAIT", wait_replicas, wait_timeout_ms) if wait_replicas > 0 else None
        self._wait_replicas = wait_replicas
        self._on_short_wait = on_short_wait
        self._host = host
        self._port = port
        self._db = db
        self._username = username
        self._password = password
        self._timeout = timeout_s
        self._connect_timeout = connect_timeout_s
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    def __repr__(self) -> str:  # never the password
        return f"MultiplexedScripts({self._host}:{self._port}/{self._db})"

    @classmethod
    def for_client(
        cls,
        client: aioredis.Redis | aioredis.RedisCluster,
        *,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
        on_short_wait: Callable[[int], None] | None = None,
    ) -> MultiplexedScripts | None:
        """The same server (or Sentinel master), database and credentials as ``client``;
        None unless plain TCP."""
        if not isinstance(client, aioredis.Redis):
            return None  # a cluster routes by slot: redis-py's client does that
        pool = client.connection_pool
        kind = pool.connection_class
        if not issubclass(kind, Connection) or issubclass(kind, SSLConnection):
            return None
        kw = pool.connection_kwargs
        resolve: Resolver | None = None
        if isinstance(pool, SentinelConnectionPool):
            resolve = pool.get_master_address
        elif "path" in kw or "host" not in kw:
            return None
        return cls(
            kw.get("host", ""),
            int(kw.get("port", 6379)),
            db=int(kw.get("db", 0) or 0),
            username=kw.get("username"),
            password=kw.get("password"),
            timeout_s=kw.get("socket_timeout") or 0.5,
            connect_timeout_s=kw.get("socket_connect_timeout") or 0.5,
            resolve=resolve,
            wait_replicas=wait_replicas,
            wait_timeout_ms=wait_timeout_ms,
            on_short_wait=on_short_wait,
        )

    async def call(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        protocol = self._protocol
        if protocol is None or protocol.closed:
            protocol = await self._connect()
        numkeys = len(keys)
        reply = await self._send(
            protocol, pack_command("EVALSHA", script.sha, numkeys, *keys, *args)
        )
        if isinstance(reply, ResponseError):
            error = _error(reply)  # redis-py's classes (LOADING, NOSCRIPT, ...)
            if not isinstance(error, NoScriptError):
                raise self._demoted(protocol, error)
            reply = await self._send(
                protocol, pack_command("EVAL", script.script, numkeys, *keys, *args)
            )
            if isinstance(reply, ResponseError):
                raise self._demoted(protocol, _error(reply))
        return reply

    async def _send(self, protocol: _Protocol, payload: bytes) -> Any:
        if self._wait is None:
            return await self._await(protocol, protocol.send(payload))
        # The script and its WAIT leave together; replies come back in the same order.
        reply_waiter = protocol.send(payload)
        acked_waiter = protocol.send(pack_command(*self._wait))
        # Read even if the script's reply fails first (no "exception never retrieved").
        acked_waiter.add_done_callback(_retrieve)
        reply = await self._await(protocol, reply_waiter)
        # WAIT itself may take its whole timeout: the reply deadline is extended by it.
        acked = await self._await(protocol, acked_waiter, extra_s=self._wait[2] / 1000)
        if (
            isinstance(acked, int)
            and acked < self._wait_replicas
            and self._on_short_wait is not None
        ):
            self._on_short_wait(acked)
        return reply

    @staticmethod
    def _demoted(protocol: _Protocol, error: ResponseError) -> Exception:
        if isinstance(error, ReadOnlyError):
            # A failover demoted this server: reconnect (to the new master) on the next call.
            failure = ConnectionError("the Redis master was demoted to a replica")
            protocol.fail(failure)
            return failure
        return error

    async def _await(
        self, protocol: _Protocol, waiter: asyncio.Future[Any], *, extra_s: float = 0.0
    ) -> Any:
        timer = protocol.loop.call_later(self._timeout + extra_s, _expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            raise
        except RedisTimeoutError:
            # Replies after this one can no longer be told apart: start over.
            protocol.fail(ConnectionError("connection to Redis dropped after a timeout"))
            raise
        finally:
            timer.cancel()

    async def _connect(self) -> _Protocol:
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.ensure_future(self._open())
        return await asyncio.shield(self._connecting)

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        if self._resolve is not None:
            self._host, self._port = await self._resolve()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(_Protocol, self._host, self._port),
                self._connect_timeout,
            )
        except TimeoutError:
            raise RedisTimeoutError(
                f"connecting to Redis at {self._host}:{self._port} timed out"
            ) from None
        except OSError as exc:
            raise ConnectionError(f"cannot connect to Redis at {self._host}:{self._port}") from exc
        setup: list[tuple[Any, ...]] = []
        if self._password is not None:
            auth = ("AUTH", self._password)
            setup.append(auth if self._username is None else ("AUTH", self._username, *auth[1:]))
        if self._db:
            setup.append(("SELECT", self._db))
        for command in setup:
            reply = await self._await(protocol, protocol.send(pack_command(*command)))
            if isinstance(reply, ResponseError):
                protocol.fail(ConnectionError("Redis refused the connection set-up"))
                raise ConnectionError(f"Redis refused {command[0]}: {reply}")
        self._protocol = protocol
        return protocol

    async def aclose(self) -> None:
        if self._protocol is not None:
            self._protocol.fail(ConnectionError("closed"))
            self._protocol = None


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(RedisTimeoutError("no reply from Redis in time"))


def _error(reply: ResponseError) -> ResponseError:
    error: ResponseError = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]
    return error
