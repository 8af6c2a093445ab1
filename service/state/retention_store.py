"""What the online host-retention controller keeps in Redis, per tenant.

Keys (``P`` = the configured prefix, ``T`` = a *configured* tenant name: never a client-chosen
string, so the key space is bounded by the deployment's configuration):

* ``P:ret:T:susp``   list: Unix times of the tenant's recent suspensions, newest first, bounded
* ``P:ret:T:res``    list: ``"resumed_at wait_s"`` of its recent resumes, newest first, bounded
* ``P:ret:T:state``  string (JSON): the controller's current view (branch, lambda, t2, counts)
* ``P:ret:T:log``    list (JSON): its recent decisions with their reasons, newest first, bounded
* ``P:ret:lease``    string: the replica that re-chooses (single writer), with an expiry

Appends from every replica are atomic list pushes (no read-modify-write, nothing lost under
concurrency); only the lease holder writes ``state`` and ``log``. Every call goes through the
store's breaker: with Redis down they raise :class:`~tenure.service.state.breaker.StateUnavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tenure.service.state.store import StateStore

__all__ = ["RetentionStore"]

T = TypeVar("T")

#: Decisions kept per tenant in the log.
DECISION_LOG_LEN = 200

# Renew the lease only if we hold it (compare-and-set), atomically.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RetentionStore:
    def __init__(self, store: StateStore, *, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self._store = store
        self._client = store.client
        self._prefix = store.keys.prefix
        self.window = window
        self._renew = self._client.register_script(_RENEW)

    def _key(self, tenant: str, what: str) -> str:
        return f"{self._prefix}:ret:{tenant}:{what}"

    @property
    def lease_key(self) -> str:
        return f"{self._prefix}:ret:lease"

    async def _call(self, op: str, make: Callable[[], Awaitable[T]]) -> T:
        # The controller's state and log: never on a proxied request's path.
        return await self._store.breaker.call(op, make, patient=True)

    async def _push(self, key: str, value: str) -> None:
        async def run() -> Any:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.lpush(key, value)
                pipe.ltrim(key, 0, self.window - 1)
                return await pipe.execute()

        await self._call("retention_push", run)

    # --- events (every replica) --------------------------------------------------------------

    async def record_suspension(self, tenant: str, at: float) -> None:
        await self._push(self._key(tenant, "susp"), repr(float(at)))

    async def record_resume(self, tenant: str, at: float, wait_s: float) -> None:
        await self._push(self._key(tenant, "res"), f"{float(at)!r} {float(wait_s)!r}")

    async def events(self, tenant: str) -> tuple[list[float], list[tuple[float, float]]]:
        """The tenant's recent suspension times and ``(resumed_at, wait_s)``, oldest first."""
        susp_key, res_key = self._key(tenant, "susp"), self._key(tenant, "res")

        async def run() -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.lrange(susp_key, 0, self.window - 1)
                pipe.lrange(res_key, 0, self.window - 1)
                return list(await pipe.execute())

        raw_susp, raw_res = await self._call("retention_events", run)
        suspensions: list[float] = []
        for item in reversed(raw_susp):
            try:
                suspensions.append(float(_text(item)))
            except ValueError:
                continue
        resumes: list[tuple[float, float]] = []
        for item in reversed(raw_res):
            try:
                at, wait = _text(item).split(" ", 1)
                resumes.append((float(at), float(wait)))
            except ValueError:
                continue
        return suspensions, resumes

    # --- the controller's view (written by the lease holder, read by all) --------------------

    async def get_state(self, tenant: str) -> dict[str, Any] | None:
        key = self._key(tenant, "state")
        raw = await self._call("retention_state", lambda: self._client.get(key))
        if raw is None:
            return None
        try:
            doc = json.loads(_text(raw))
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    async def put_state(self, tenant: str, doc: dict[str, Any]) -> None:
        key = self._key(tenant, "state")
        text = json.dumps(doc)
        await self._call("retention_state", lambda: self._client.set(key, text))

    async def log_decision(self, tenant: str, doc: dict[str, Any]) -> None:
        key, text = self._key(tenant, "log"), json.dumps(doc)

        async def run() -> Any:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.lpush(key, text)
                pipe.ltrim(key, 0, DECISION_LOG_LEN - 1)
                return await pipe.execute()

        await self._call("retention_log", run)

    async def decisions(self, tenant: str, limit: int) -> list[dict[str, Any]]:
        key = self._key(tenant, "log")
        raw = await self._call(
            "retention_log", lambda: self._client.lrange(key, 0, max(0, limit - 1))
        )
        out: list[dict[str, Any]] = []
        for item in raw:
            try:
                doc = json.loads(_text(item))
            except ValueError:
                continue
            if isinstance(doc, dict):
                out.append(doc)
        return out

    # --- single writer -----------------------------------------------------------------------

    async def hold_lease(self, owner: str, lease_s: float) -> bool:
        """Take or renew the controller lease; ``True`` while ``owner`` holds it."""
        key, ms = self.lease_key, max(1, int(lease_s * 1000))

        async def run() -> bool:
            if await self._client.set(key, owner, nx=True, px=ms):
                return True
            return bool(await self._renew(keys=[key], args=[owner, ms]))

        return await self._call("retention_lease", run)
