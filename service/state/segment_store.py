"""Each session's segment bookkeeping in Redis: one bounded JSON string per session.

``P:seg:T:S`` (:meth:`~service.state.keys.Keys.segments`) holds the
:class:`~service.api.segment_state.SegmentState` codec's bytes: role, parent, the ranker's
prediction, the prompt-side segments of the latest turn and the facts of its response. Its id
space is the session's (tenant-scoped key, sidecar-chosen segment ids), its size is bounded by
the wire's segment limit, it expires with the session record and is deleted when the session
ends. Reads and writes go through the store's breaker: with Redis down, callers get
:class:`~service.state.breaker.StateUnavailable` at once.
"""

from __future__ import annotations

from service.state.store import StateStore

__all__ = ["MAX_STATE_BYTES", "SegmentStore"]

#: A state larger than this is a bug or another writer's: refused, never stored.
MAX_STATE_BYTES = 16 * 1024


class SegmentStore:
    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._keys = store.keys
        self._client = store.client

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
        await self._store.breaker.call(
            "segments_put", lambda: self._client.set(key, state, ex=max(1, ttl_s))
        )

    async def create(self, tenant: str, session: str, state: bytes, ttl_s: int) -> bool:
        """Store a new session's state; False if one exists already (nothing changed)."""
        key = self._keys.segments(tenant, session)
        done = await self._store.breaker.call(
            "segments_put", lambda: self._client.set(key, state, ex=max(1, ttl_s), nx=True)
        )
        return bool(done)

    async def delete(self, tenant: str, session: str) -> None:
        key = self._keys.segments(tenant, session)
        await self._store.breaker.call("segments_delete", lambda: self._client.delete(key))
