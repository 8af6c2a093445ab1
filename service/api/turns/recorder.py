"""The sidecar's recording of the traffic it proxies (off by default), kept bounded in Redis.

The proxy calls :meth:`Recorder.begin` when a tracked request arrives on any tracked route
(chat, ``/v1/messages``, ``/v1/responses``; only while recording: the request's prefix hashes
cost one pass over its bytes, hashed from the route's own message structure, see
:mod:`tenure.service.record.events`) and :meth:`Recorder.finish` after the answer was handed to the
client, off the response path; token counts come from the route's own usage fields
(``prompt_tokens``/``completion_tokens``; Anthropic's ``input_tokens`` plus its cache reads
and writes, ``output_tokens``; the Responses API's ``input_tokens``/``output_tokens``).
Each finished turn is one :class:`~tenure.service.record.events.RecordedTurn` appended to one Redis
list by a script that first adds its size to a byte counter and refuses it past
``TENURE_RECORD_MAX_BYTES`` (counted as dropped): the recording is bounded however long it
stays on, and every replica on one Redis appends to the same recording. Recording never fails
a request: a Redis error drops the turn.

A Responses request that continues a stored answer carries only its new input; its pieces go
on from the pieces of the request that answer came from (:meth:`Recorder.answered` keeps
them, per tenant, for the last :data:`MAX_CONTINUATIONS` answers of this replica, at most
:data:`MAX_CONTINUATION_PIECES` pieces in all). A chained
request whose answer this replica never saw (another replica's, or one older than that) is
recorded from its own input alone: its token counts stay right, its prefix sharing is lost.

On/off: the ``TENURE_RECORD_ENABLED`` setting at start-up, then ``PUT /admin/record`` (per
replica: each replica is switched where the call lands). The export
(``GET /admin/record/export``, ``tenure record export``) is the canonical format.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from array import array
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from tenure.service.api.hints.tenure import Hints
from tenure.service.api.shapes import messages, responses
from tenure.service.record.events import (
    MAX_CHUNKS,
    RecordedTurn,
    hashed_session,
    item_bytes,
    prefix_chunks,
    request_bytes,
)

__all__ = [
    "MAX_CONTINUATIONS",
    "MAX_CONTINUATION_PIECES",
    "PendingTurn",
    "RecordStatus",
    "Recorder",
    "usage_tokens",
]

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
#: Answers whose request pieces a replica keeps for the requests that continue them, and the
#: most pieces kept for them in all (8 bytes each: 8 MiB), oldest answer forgotten first.
MAX_CONTINUATIONS = 4096
MAX_CONTINUATION_PIECES = 1 << 20
#: An answer's size in the prompt that continues it, per output token (its text is not seen).
_ANSWER_BYTES_PER_TOKEN = 4


def usage_tokens(route: str, usage: Mapping[str, int] | None) -> tuple[int | None, int | None]:
    """``(prompt, completion)`` tokens from the usage fields a route's answer carried (their
    names without ``_tokens``); ``None`` where the answer said nothing."""
    if not usage:
        return None, None
    if route == "messages":
        # Anthropic counts cache reads and writes apart from input_tokens (vLLM too).
        parts = [usage.get(k) for k in ("input", "cache_read_input", "cache_creation_input")]
        given = [v for v in parts if v is not None]
        prompt = sum(given) if given else None
        return prompt, usage.get("output")
    if route == "responses":
        return usage.get("input"), usage.get("output")
    return usage.get("prompt"), usage.get("completion")


@dataclass(frozen=True, slots=True)
class _Continuation:
    """What a request that continues an answer goes on from."""

    head: bytes  # digest of the head its pieces were hashed under
    chunks: array[int]
    answer: str
    answer_tokens: int


def _head_digest(head: bytes) -> bytes:
    return hashlib.blake2b(head, digest_size=16).digest()


@dataclass(slots=True)
class PendingTurn:
    """What the request side knew when the turn arrived."""

    arrival_s: float
    chunks: list[int]
    request_bytes: int
    parent: str | None
    last_turn: bool
    expected_gap_s: float | None
    route: str = "chat"
    #: Responses: a digest of the head the pieces were hashed under (model, instructions,
    #: tools) and the stored conversation the request continues, for :meth:`Recorder.answered`.
    head: bytes = b""
    continues: str | None = None


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
        #: ``(tenant, "resp:<answer id>" | "conv:<conversation id>")`` -> what continues it.
        self._continuations: OrderedDict[tuple[str, str], _Continuation] = OrderedDict()
        self._continuation_pieces = 0

    # --- the proxy's hook ------------------------------------------------------------------

    def begin(
        self, payload: dict[str, Any], hints: Hints, route: str = "chat", tenant: str = ""
    ) -> PendingTurn | None:
        """Called for a tracked request; ``None`` while not recording."""
        if not self.enabled:
            return None
        model = payload.get("model")
        if route == "responses":
            return self._begin_response(payload, hints, tenant)
        if route == "messages":
            items: list[Any] = messages.recorded_items(payload)
        else:
            items = payload.get("messages")  # type: ignore[assignment]
            if not isinstance(items, list):
                items = [payload.get("prompt")]
        data = request_bytes(model, items)
        return self._pending(prefix_chunks(data, self.chunk_bytes), len(data), hints, route)

    def _pending(
        self, chunks: list[int], size: int, hints: Hints, route: str, **extra: Any
    ) -> PendingTurn:
        return PendingTurn(
            self.clock(), chunks, size, hints.parent, hints.last_turn, hints.expected_gap_s,
            route, **extra,
        )  # fmt: skip

    def _begin_response(self, payload: dict[str, Any], hints: Hints, tenant: str) -> PendingTurn:
        head_items, items = responses.recorded_items(payload)
        head = request_bytes(payload.get("model"), head_items)
        digest = _head_digest(head)
        continues = responses.continued(payload)
        before = None if continues is None else self._continuations.get((tenant, continues))
        if before is None or before.head != digest or not before.chunks:
            # A new conversation (or one this replica never saw answered): its own bytes.
            data = head + item_bytes(items)
            chunks = prefix_chunks(data, self.chunk_bytes)
            size = len(data)
        else:
            self._continuations.move_to_end((tenant, continues))  # type: ignore[arg-type]
            # The answer stands in the prompt as bytes of its estimated size named by its id.
            answer = f"answer {before.answer}".encode()
            answer = answer.ljust(max(len(answer), before.answer_tokens * _ANSWER_BYTES_PER_TOKEN))
            more = answer + item_bytes(items)
            chunks = before.chunks.tolist()
            chunks += prefix_chunks(more, self.chunk_bytes, chunks[-1])
            del chunks[MAX_CHUNKS:]
            # The canonical export counts every piece but the last as chunk_bytes long.
            size = len(before.chunks) * self.chunk_bytes + len(more)
        return self._pending(chunks, size, hints, "responses", head=digest, continues=continues)

    def answered(
        self, pending: PendingTurn, tenant: str, answer_id: str | None, usage: Mapping[str, int]
    ) -> None:
        """A Responses turn was answered: keep its pieces for the requests continuing it."""
        if pending.route != "responses" or not pending.chunks:
            return
        _prompt, completion = usage_tokens("responses", usage)
        keys = [f"resp:{answer_id}"] if answer_id else []
        if pending.continues is not None and pending.continues.startswith("conv:"):
            keys.append(pending.continues)  # the conversation now continues from this answer
        if not keys:
            return
        entry = _Continuation(
            pending.head, array("q", pending.chunks), answer_id or keys[0], max(1, completion or 1)
        )
        book = self._continuations
        for key in keys:
            old = book.pop((tenant, key), None)
            if old is not None:
                self._continuation_pieces -= len(old.chunks)
            book[(tenant, key)] = entry
            self._continuation_pieces += len(entry.chunks)
        while book and (
            len(book) > MAX_CONTINUATIONS or self._continuation_pieces > MAX_CONTINUATION_PIECES
        ):
            _key, gone = book.popitem(last=False)
            self._continuation_pieces -= len(gone.chunks)

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
        likely_end: bool = False,
    ) -> None:
        prompt, completion = usage_tokens(pending.route, usage)
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
                prompt_tokens=prompt,
                completion_tokens=completion,
                stop=stop or "",
                parent=None if parent is None else hashed_session(key, tenant, parent),
                last_turn=pending.last_turn and not cut,
                expected_gap_s=pending.expected_gap_s,
                cut=cut,
                chunk_bytes=self.chunk_bytes,
                route=pending.route,
                likely_end=likely_end and not cut,
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
