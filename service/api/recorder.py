"""The sidecar's recording of the traffic it proxies (off by default), kept bounded in Redis.

The proxy calls :meth:`Recorder.begin` when a tracked request arrives (only while recording:
the request's prefix hashes cost one pass over its bytes) and :meth:`Recorder.finish` after the
answer was handed to the client, off the response path. Each finished turn is one
:class:`~service.record.events.RecordedTurn` appended to one Redis list by a script that first
adds its size to a byte counter and refuses it past ``TENURE_RECORD_MAX_BYTES`` (counted as
dropped): the recording is bounded however long it stays on, and every replica on one Redis
appends to the same recording. Recording never fails a request: a Redis error drops the turn.

On/off: the ``TENURE_RECORD_ENABLED`` setting at start-up, then ``PUT /admin/record`` (per
replica: each replica is switched where the call lands). The export
(``GET /admin/record/export``, ``tenure record export``) is the canonical format.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from service.api.hints import Hints
from service.record.events import RecordedTurn, hashed_session, prefix_chunks, request_bytes

__all__ = ["PendingTurn", "RecordStatus", "Recorder"]

log = logging.getLogger(__name__)

_APPEND = """
local size = tonumber(ARGV[2])
if redis.call('INCRBY', KEYS[2], size) > tonumber(ARGV[1]) then
  redis.call('DECRBY', KEYS[2], size)
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('RPUSH', KEYS[1], ARGV[3])
return 1
"""
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(RecordedTurn).decode
_PAGE = 1000


@dataclass(slots=True)
class PendingTurn:
    """What the request side knew when the turn arrived."""

    arrival_s: float
    chunks: list[int]
    request_bytes: int
    parent: str | None
    last_turn: bool
    expected_gap_s: float | None


@dataclass(frozen=True, slots=True)
class RecordStatus:
    enabled: bool
    turns: int
    bytes: int
    max_bytes: int
    dropped: int
    chunk_bytes: int


class Recorder:
    def __init__(
        self,
        client: aioredis.Redis | aioredis.RedisCluster,
        prefix: str,
        *,
        enabled: bool,
        max_bytes: int,
        chunk_bytes: int,
        clock: Callable[[], float],
    ) -> None:
        self.client = client
        self.enabled = enabled
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self.clock = clock
        self._list = f"{prefix}:record:turns"
        self._bytes = f"{prefix}:record:bytes"
        self._dropped = f"{prefix}:record:dropped"
        self._key_name = f"{prefix}:record:key"
        self._key: bytes | None = None
        self._append = client.register_script(_APPEND)

    # --- the proxy's hook ------------------------------------------------------------------

    def begin(self, payload: dict[str, Any], hints: Hints) -> PendingTurn | None:
        """Called for a tracked request; ``None`` while not recording."""
        if not self.enabled:
            return None
        messages = payload.get("messages")
        if not isinstance(messages, list):
            messages = [payload.get("prompt")]
        data = request_bytes(payload.get("model"), messages)
        return PendingTurn(
            self.clock(),
            prefix_chunks(data, self.chunk_bytes),
            len(data),
            hints.parent,
            hints.last_turn,
            hints.expected_gap_s,
        )

    async def finish(
        self,
        pending: PendingTurn,
        *,
        tenant: str,
        session: str,
        turn: int,
        stop: str | None,
        usage: dict[str, int] | None,
        cut: bool,
    ) -> None:
        usage = usage or {}
        try:
            key = await self._hash_key()
            parent = pending.parent
            event = RecordedTurn(
                session=hashed_session(key, tenant, session),
                turn=turn,
                arrival_s=pending.arrival_s,
                end_s=self.clock(),
                chunks=pending.chunks,
                request_bytes=pending.request_bytes,
                prompt_tokens=usage.get("prompt"),
                completion_tokens=usage.get("completion"),
                stop=stop or "",
                parent=None if parent is None else hashed_session(key, tenant, parent),
                last_turn=pending.last_turn and not cut,
                expected_gap_s=pending.expected_gap_s,
                cut=cut,
                chunk_bytes=self.chunk_bytes,
            )
            blob = _encode(event)
            await self._append(
                keys=[self._list, self._bytes, self._dropped],
                args=[self.max_bytes, len(blob), blob],
            )
        except (TimeoutError, RedisError, OSError):
            log.debug("recording a turn failed; the turn is not recorded", exc_info=True)

    async def _hash_key(self) -> bytes:
        if self._key is None:
            # One key for every replica: the first to record sets it.
            await self.client.set(self._key_name, secrets.token_hex(32), nx=True)
            value = await self.client.get(self._key_name)
            self._key = bytes.fromhex(value.decode() if isinstance(value, bytes) else str(value))
        return self._key

    # --- the admin side --------------------------------------------------------------------

    async def status(self) -> RecordStatus:
        pipe = self.client.pipeline(transaction=False)
        pipe.llen(self._list)
        pipe.get(self._bytes)
        pipe.get(self._dropped)
        turns, size, dropped = await pipe.execute()
        return RecordStatus(
            self.enabled, int(turns), int(size or 0), self.max_bytes, int(dropped or 0),
            self.chunk_bytes,
        )  # fmt: skip

    async def events(self) -> AsyncIterator[RecordedTurn]:
        start = 0
        while True:
            page = await self.client.lrange(self._list, start, start + _PAGE - 1)
            for blob in page:
                try:
                    yield _decode(blob)
                except msgspec.DecodeError:
                    continue  # not ours (a foreign write): skip it, keep the rest
            if len(page) < _PAGE:
                return
            start += _PAGE

    async def clear(self) -> None:
        """Forget the recording (the hash key stays, so ids stay stable across clears)."""
        await self.client.delete(self._list, self._bytes, self._dropped)
