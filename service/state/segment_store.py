"""Each session's segment bookkeeping in Redis: one bounded JSON string per session.

``P:seg:T:S`` (:meth:`~tenure.service.state.keys.Keys.segments`) holds the
:class:`~tenure.service.api.segments.state.SegmentState` codec's bytes: role, parent, the ranker's
prediction, the prompt-side segments of the latest turn and the facts of its response. Its id
space is the session's (tenant-scoped key, sidecar-chosen segment ids), its size is bounded by
the wire's segment limit, it expires with the session record and is deleted when the session
ends. Reads and writes go through the store's breaker: with Redis down, callers get
:class:`~tenure.service.state.breaker.StateUnavailable` at once.

``P:segw:T:S`` (:meth:`~tenure.service.state.keys.Keys.segment_workers`) is a parent's worker
history, a hash: workers spawned (``n``), returned (``r``), the sum of the returned ones' log
lifetimes (``l``), the parent turn of the latest spawn with the spawns made since that turn (``gt``,
``gn``: the fan-out so far), and one ``w:<worker>`` field per worker counted (its place, so a
worker seen again, a first request retried, is not counted twice; at most
:data:`MAX_WORKERS_REMEMBERED`, beyond which a retry could count twice). It is a hash beside
the state, not a field of it, because the state is rewritten whole from what a turn read when
it arrived, which would drop a spawn or return counted meanwhile; the scripts below update it
in place, atomically, so concurrent spawns (a fan-out of first requests) and returns are never
lost. Its TTL follows the state's (every :meth:`SegmentStore.put` renews both) and
:meth:`SegmentStore.delete` removes both.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tenure.service.policy.spawn_context import WorkerHistory
from tenure.service.state.store import StateStore

__all__ = ["MAX_STATE_BYTES", "MAX_WORKERS_REMEMBERED", "SegmentStore", "Spawned"]

#: Workers of one parent remembered by id (the session record's own cap on its workers).
MAX_WORKERS_REMEMBERED = 1024

#: KEYS: 1 the parent's counters; ARGV: 1 the parent's turn, 2 ttl s, 3 worker id, 4 cap.
#: Returns {workers before, returned, log lifetime sum, siblings before it since that turn};
#: a worker counted already gets its own place back (and the returns counted since).
_SPAWNED = """
local field = 'w:' .. ARGV[3]
local v = redis.call('HMGET', KEYS[1], 'n', 'r', 'l', 'gt', 'gn', field)
local returned, log_sum = tonumber(v[2] or '0') or 0, v[3] or '0'
if v[6] then
  local before, since = string.match(v[6], '^(%d+) (%d+)$')
  return {tonumber(before) or 0, returned, log_sum, tonumber(since) or 0}
end
local before = tonumber(v[1] or '0') or 0
local since = 0
if v[4] == ARGV[1] then since = tonumber(v[5] or '0') or 0 end
redis.call('HSET', KEYS[1], 'n', before + 1, 'gt', ARGV[1], 'gn', since + 1)
if before < tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[1], field, before .. ' ' .. since)
end
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {before, returned, log_sum, since}
"""
#: KEYS: 1 the parent's counters; ARGV: 1 the worker's log lifetime. A parent whose counters
#: are gone (ended, expired) gets none back: a late return recreates nothing.
_RETURNED = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'r', 1)
redis.call('HINCRBYFLOAT', KEYS[1], 'l', ARGV[1])
return 1
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


#: A state larger than this is a bug or another writer's: refused, never stored.
MAX_STATE_BYTES = 16 * 1024


class SegmentStore:
    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._keys = store.keys
        self._client = store.client
        self._spawned = self._client.register_script(_SPAWNED)
        self._returned = self._client.register_script(_RETURNED)

    async def get(self, tenant: str, session: str) -> bytes | None:
        key = self._keys.segments(tenant, session)
        raw: bytes | str | None = await self._store.breaker.call(
            "segments_get", lambda: self._client.get(key)
        )
        if raw is None:
            return None
        return raw.encode() if isinstance(raw, str) else raw

    async def put(self, tenant: str, session: str, state: bytes, ttl_s: int) -> None:
        if len(state) > MAX_STATE_BYTES:
            raise ValueError(f"segment state of {len(state)} bytes (at most {MAX_STATE_BYTES})")
        key = self._keys.segments(tenant, session)
        workers = self._keys.segment_workers(tenant, session)
        ttl = max(1, ttl_s)

        async def run() -> Any:
            # The worker history lives as long as the state (a no-op when it has none).
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.set(key, state, ex=ttl)
                pipe.expire(workers, ttl)
                return await pipe.execute()

        await self._store.breaker.call("segments_put", run)

    async def create(self, tenant: str, session: str, state: bytes, ttl_s: int) -> bool:
        """Store a new session's state; False if one exists already (nothing changed)."""
        key = self._keys.segments(tenant, session)
        done = await self._store.breaker.call(
            "segments_put", lambda: self._client.set(key, state, ex=max(1, ttl_s), nx=True)
        )
        return bool(done)

    async def delete(self, tenant: str, session: str) -> None:
        key = self._keys.segments(tenant, session)
        workers = self._keys.segment_workers(tenant, session)
        # One DEL per key: on a cluster the two live in different slots.
        await self._store.breaker.call("segments_delete", lambda: self._client.delete(key))
        await self._store.breaker.call("segments_delete", lambda: self._client.delete(workers))

    async def spawned(
        self, tenant: str, parent: str, worker: str, parent_turn: int, ttl_s: int
    ) -> Spawned:
        """Count ``worker`` spawned under ``parent`` after its turn ``parent_turn`` (once:
        again, it gets its first answer back): the history before it and its place among the
        siblings spawned since that turn."""
        key = self._keys.segment_workers(tenant, parent)
        args = [str(parent_turn), str(max(1, ttl_s)), worker, str(MAX_WORKERS_REMEMBERED)]
        raw = await self._store.breaker.call(
            "segments_workers", lambda: self._spawned(keys=[key], args=args)
        )
        before, returned, log_sum, since = raw
        history = WorkerHistory(int(before), int(returned), float(_text(log_sum)))
        return Spawned(history, int(since))

    async def returned(self, tenant: str, parent: str, log_lifetime: float) -> None:
        """Count a worker of ``parent`` returned with the given log lifetime."""
        key = self._keys.segment_workers(tenant, parent)
        args = [repr(float(log_lifetime))]
        await self._store.breaker.call(
            "segments_workers", lambda: self._returned(keys=[key], args=args)
        )


class Spawned(NamedTuple):
    history: WorkerHistory
    sibling_index: int
