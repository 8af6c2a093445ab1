"""Each session's segment bookkeeping in Redis: one bounded JSON string per session.

``P:seg:T:S`` (:meth:`~service.state.keys.Keys.segments`) holds the
:class:`~service.api.segment_state.SegmentState` codec's bytes: role, parent, the ranker's
prediction, the prompt-side segments of the latest turn and the facts of its response. Its id
space is the session's (tenant-scoped key, sidecar-chosen segment ids), its size is bounded by
the wire's segment limit, it expires with the session record and is deleted when the session
ends. Reads and writes go through the store's breaker: with Redis down, callers get
:class:`~service.state.breaker.StateUnavailable` at once.

``P:segw:T:S`` (:meth:`~service.state.keys.Keys.segment_workers`) is a parent's worker history,
a hash of five numbers: workers spawned (``n``), returned (``r``), the sum of the returned
ones' log lifetimes (``l``), and the parent turn of the latest spawn with the spawns made since
that turn (``gt``, ``gn``: the fan-out so far). It is a hash beside the state, not a field of
it, because the state is rewritten whole from what a turn read when it arrived, which would
drop a spawn or return counted meanwhile; the scripts below update it in place, atomically,
so concurrent spawns and returns are never lost. Its TTL follows the state's (every
:meth:`SegmentStore.put` renews both) and :meth:`SegmentStore.delete` removes both.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from service.policy.spawn_context import WorkerHistory
from service.state.store import StateStore

__all__ = ["MAX_STATE_BYTES", "SegmentStore", "Spawned"]

#: KEYS: 1 the parent's counters; ARGV: 1 the parent's turn, 2 ttl s.
#: Returns {workers before, returned before, log lifetime sum, siblings since that turn}.
_SPAWNED = """
local before = redis.call('HINCRBY', KEYS[1], 'n', 1) - 1
local v = redis.call('HMGET', KEYS[1], 'r', 'l', 'gt', 'gn')
local since = 0
if v[3] == ARGV[1] then since = tonumber(v[4]) or 0 end
redis.call('HSET', KEYS[1], 'gt', ARGV[1], 'gn', since + 1)
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[2]))
return {before, tonumber(v[1] or '0') or 0, v[2] or '0', since}
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

    async def spawned(self, tenant: str, parent: str, parent_turn: int, ttl_s: int) -> Spawned:
        """Count a worker spawned under ``parent`` after its turn ``parent_turn``: the
        history before it and its place among the siblings spawned since that turn."""
        key = self._keys.segment_workers(tenant, parent)
        args = [str(parent_turn), str(max(1, ttl_s))]
        raw = await self._store.breaker.call(
            "segments_workers", lambda: self._spawned(keys=[key], args=args)
        )
        before, returned, log_sum, since = raw
        history = WorkerHistory(int(before), int(returned), float(_text(log_sum)))
        return Spawned(history, int(since))

    async def history(self, tenant: str, parent: str, parent_turn: int) -> Spawned:
        """What :meth:`spawned` would return, without counting a worker."""
        key = self._keys.segment_workers(tenant, parent)
        raw = await self._store.breaker.call(
            "segments_workers", lambda: self._client.hmget(key, ["n", "r", "l", "gt", "gn"])
        )
        n, r, log_sum, group_turn, since = raw
        same = group_turn is not None and _text(group_turn) == str(parent_turn)
        history = WorkerHistory(
            int(_text(n)) if n else 0, int(_text(r)) if r else 0, float(_text(log_sum or "0"))
        )
        return Spawned(history, int(_text(since)) if same and since else 0)

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
