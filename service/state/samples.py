"""The state store's samples and runtime config: gap observations, waits, the config document,
the engines' residency summaries.

Part of :class:`~service.state.store.StateStore` (which sets ``client``, ``keys``, ``limits``
and guards every call with its breaker): the reads and writes off the per-request path that
feed the online models (gap prediction, the retention regime) and the admin's runtime config.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis

from service.state.keys import Keys
from service.state.records import GapObservation, StoreLimits, parse_observation, text
from service.state.topology import RedisClient

__all__ = ["YIELD_EVERY", "SamplesAndConfig"]

T = TypeVar("T")
#: Long sample lists are parsed (and models rebuilt from them) in slices of this many, yielding
#: to the event loop between: thousands at once held every proxied request for milliseconds.
YIELD_EVERY = 256


class SamplesAndConfig:
    """Sample lists and the runtime config document (see the module docstring)."""

    client: RedisClient
    keys: Keys
    limits: StoreLimits

    async def _call(self, op: str, make: Callable[[], Awaitable[T]]) -> T:
        raise NotImplementedError  # the store's breaker-guarded call

    async def _call_patient(self, op: str, make: Callable[[], Awaitable[T]]) -> T:
        raise NotImplementedError  # the same, trying Redis even while the breaker is open

    async def gap_observations(self, tenant: str, count: int) -> list[GapObservation]:
        """Observed gaps, oldest first (the order the predictor must learn them in)."""
        key = self.keys.gap_observations(tenant)
        raw = await self._call_patient(
            "gap_observations", lambda: self.client.lrange(key, 0, count - 1)
        )
        out: list[GapObservation] = []
        for i, item in enumerate(reversed(raw)):
            observation = parse_observation(item)
            if observation is not None:
                out.append(observation)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # thousands of entries: let proxied requests through
        return out

    async def gap_log_head(self, tenant: str) -> tuple[int, str]:
        """``(length, newest entry)`` of the gap log: cheap change detection for refreshes."""
        key = self.keys.gap_observations(tenant)

        async def fetch() -> list[Any]:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.llen(key)
                pipe.lindex(key, 0)
                return list(await pipe.execute())

        length, head = await self._call_patient("gap_observations", fetch)
        return int(length), text(head) if head is not None else ""

    async def float_samples(self, which: str, count: int) -> list[float]:
        """Recent suspension waits (``"waits"``) or suspension times (``"suspensions"``)."""
        key = {"waits": self.keys.waits, "suspensions": self.keys.suspensions}[which]
        raw = await self._call_patient(which, lambda: self.client.lrange(key, 0, count - 1))
        out = []
        for i, item in enumerate(raw):
            try:
                out.append(float(text(item)))
            except ValueError:
                continue
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
        return out

    async def add_wait_samples(self, waits: Sequence[float]) -> int:
        key, limit = self.keys.waits, self.limits.wait_samples_maxlen

        async def push() -> list[Any]:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.lpush(key, *(repr(float(w)) for w in waits))
                pipe.ltrim(key, 0, limit - 1)
                pipe.llen(key)
                return list(await pipe.execute())

        result = await self._call_patient("waits", push)
        return int(result[-1])

    # --- runtime configuration --------------------------------------------------------------

    async def get_config(self) -> dict[str, Any] | None:
        key = self.keys.config
        raw = await self._call_patient("config", lambda: self.client.get(key))
        if raw is None:
            return None
        value = msgspec.json.decode(raw)
        return value if isinstance(value, dict) else None

    async def update_config(
        self, mutate: Callable[[dict[str, Any] | None], Mapping[str, Any]]
    ) -> dict[str, Any]:
        """Optimistic read-modify-write of the config document (WATCH / MULTI)."""
        key = self.keys.config

        async def transact() -> dict[str, Any]:
            async with self.client.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        await pipe.watch(key)
                        raw = await pipe.get(key)
                        current = msgspec.json.decode(raw) if raw is not None else None
                        updated = dict(mutate(current if isinstance(current, dict) else None))
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.set(key, msgspec.json.encode(updated))
                        await pipe.execute()
                        return updated
                    except aioredis.WatchError:
                        continue

        return await self._call_patient("config", transact)

    # --- engines (several behind a router) -----------------------------------------------

    async def record_engine(self, engine: str, summary: Mapping[str, Any], moves: int) -> None:
        """The newest residency summary of ``engine`` (a bounded label), and its moves."""
        k = self.keys

        async def write() -> None:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(k.engines, engine, msgspec.json.encode(summary))
                if moves > 0:
                    pipe.hincrby(k.engine_moves, engine, moves)
                await pipe.execute()

        # The push server's receive loop waits on this: fail fast while Redis is away.
        await self._call("engines", write)

    async def engines(self) -> list[tuple[str, dict[str, Any], int]]:
        """``(engine, newest summary, sessions moved to it)`` of every engine ever reported."""
        k = self.keys

        async def read() -> list[Any]:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hgetall(k.engines)
                pipe.hgetall(k.engine_moves)
                return list(await pipe.execute())

        summaries, moves = await self._call_patient("engines", read)
        counts = {text(name): int(value) for name, value in moves.items()}
        out = []
        for name, raw in sorted(summaries.items()):
            summary = msgspec.json.decode(raw)
            if isinstance(summary, dict):
                out.append((text(name), summary, counts.get(text(name), 0)))
        return out
