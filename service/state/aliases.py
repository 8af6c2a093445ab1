"""Answer ids that name a session: ``/v1/responses`` chains by ``previous_response_id``.

``P:ans:T:H`` (string, ``H`` = digest of the answer id) holds the session that answer belongs
to, for as long as a session record lives. The key carries the tenant, so an answer id is
resolved only within the tenant whose request produced it: another tenant's id is simply not
found, never chained.
"""

from __future__ import annotations

import hashlib

from tenure.service.state.store import StateStore

__all__ = ["answer_key", "remember", "resolve"]


def answer_key(prefix: str, tenant: str, answer_id: str) -> str:
    # Hashed: client text never becomes an unbounded key.
    digest = hashlib.blake2b(answer_id.encode("utf-8", "replace"), digest_size=16).hexdigest()
    return f"{prefix}:ans:{tenant}:{digest}"


async def remember(
    store: StateStore, tenant: str, answer_id: str, session: str, ttl_s: float
) -> None:
    key = answer_key(store.keys.prefix, tenant, answer_id)
    seconds = max(1, int(ttl_s))
    await store.breaker.call("alias_set", lambda: store.client.set(key, session, ex=seconds))


async def resolve(store: StateStore, tenant: str, answer_id: str) -> str | None:
    key = answer_key(store.keys.prefix, tenant, answer_id)
    found = await store.breaker.call("alias_get", lambda: store.client.get(key))
    if found is None:
        return None
    return found.decode() if isinstance(found, bytes) else str(found)
