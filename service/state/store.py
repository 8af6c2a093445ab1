"""The Redis repository: session lifecycle records, decisions, samples and runtime config.

All writes go through the atomic scripts in :mod:`tenure.service.state.scripts`; keys come from
:mod:`tenure.service.state.keys`. Every call is guarded by a
:class:`~tenure.service.state.breaker.Breaker`, so when Redis is down callers get
:class:`StateUnavailable` at once (and fail open or answer
503) instead of waiting on timeouts, and the first call after the retry delay probes recovery.

Besides the per-request path: the reads and writes that feed the online models (gap
observations, waits, the engines' residency summaries) and the admin's runtime config document.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript

from tenure.service.state import scripts
from tenure.service.state.batcher import DirectScripts, ScriptBatcher
from tenure.service.state.breaker import Breaker, StateUnavailable
from tenure.service.state.keys import Keys, scoped_session_id
from tenure.service.state.multiplex import MultiplexedScripts
from tenure.service.state.records import (
    GapObservation,
    SessionExists,
    SessionNotFound,
    SessionUpdate,
    StoreLimits,
    TurnStart,
    parse_observation,
    text,
)
from tenure.service.state.scripts import ApplyStatus, RollbackStatus
from tenure.service.state.topology import RedisClient
from tenure.service.wire.decision_codec import decision_body, decision_parts, decode_decision
from tenure.service.wire.push import Decision
from tenure.service.wire.session_record import RecordField, SessionRecord

__all__ = ["YIELD_EVERY", "StateStore", "StateUnavailable"]

T = TypeVar("T")
#: Long sample lists are parsed (and models rebuilt from them) in slices of this many, yielding
#: to the event loop between: thousands at once held every proxied request for milliseconds.
YIELD_EVERY = 256


class StateStore:
    """Async access to everything the sidecar keeps in Redis."""

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        breaker: Breaker,
        limits: StoreLimits | None = None,
        *,
        multiplex: bool = True,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 100,
        on_short_wait: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.breaker = breaker
        self.limits = limits or StoreLimits()
        self._turn_start: AsyncScript = client.register_script(scripts.TURN_START)
        self._apply: AsyncScript = client.register_script(scripts.APPLY)
        self._rollback: AsyncScript = client.register_script(scripts.ROLLBACK)
        # The two hot-path scripts: over one pipelined connection where the URL allows (plain
        # TCP, also behind Sentinel), else through redis-py with same-iteration calls
        # coalesced; on a cluster one by one (redis-py routes each to its slot's master).
        fast = (
            MultiplexedScripts.for_client(
                client,
                wait_replicas=wait_replicas,
                wait_timeout_ms=wait_timeout_ms,
                on_short_wait=on_short_wait,
            )
            if multiplex
            else None
        )
        self._scripts: MultiplexedScripts | ScriptBatcher | DirectScripts
        if fast is not None:
            self._scripts = fast
        elif isinstance(client, aioredis.RedisCluster):
            self._scripts = DirectScripts()
        else:
            self._scripts = ScriptBatcher(client)

    async def aclose(self) -> None:
        """Close the hot path's own connection (the redis-py client is closed by its owner)."""
        if isinstance(self._scripts, MultiplexedScripts):
            await self._scripts.aclose()

    async def _call(self, op: str, make: Callable[[], Awaitable[T]]) -> T:
        return await self.breaker.call(op, make)

    async def _call_patient(self, op: str, make: Callable[[], Awaitable[T]]) -> T:
        """A call nobody's proxied request waits on (samples, config, engines): it tries Redis
        even while the breaker is open (see :meth:`Breaker.call`)."""
        return await self.breaker.call(op, make, patient=True)

    # --- hot path ---------------------------------------------------------------------------

    async def turn_start(
        self,
        tenant: str,
        *,
        session: str | None,
        prefix_digests: Sequence[str],
        new_session_id: str,
        segment: str | None,
        parent: str | None,
        last_turn: bool,
        decision: Decision,
        now: float,
    ) -> TurnStart:
        """One round trip: resolve (or infer) the session, count the turn, publish "active"."""
        k = self.keys
        keys = [
            k.live(tenant),
            k.decision_seq,
            k.decisions,
            k.decision_table,
            k.decision_gc,
            k.gap_observations(tenant),
            k.waits,
        ]
        if session is None:
            keys.extend(k.prefix_hash(tenant, digest) for digest in prefix_digests)
        packed = [
            repr(now),
            session or "",
            k.session(tenant, ""),
            new_session_id,
            scoped_session_id(tenant, ""),
            segment or "",
            parent or "",
            "1" if last_turn else "0",
            str(self.limits.session_ttl_s),
            str(self.limits.decision_stream_maxlen),
            str(self.limits.list_maxlen),
        ]
        args = [*packed, decision_body(decision)]
        raw = await self._call(
            "turn_start", lambda: self._scripts.call(self._turn_start, keys, args)
        )
        sid, turn, prev_state, observed, seq, inferred = raw
        return TurnStart(
            session=text(sid),
            turn=int(turn),
            previous_state=text(prev_state),
            observation=parse_observation(observed) if observed else None,
            seq=int(seq),
            inferred=bool(int(inferred)),
        )

    async def rollback_turn(
        self, tenant: str, session: str, turn: int, *, now: float, forget_new: bool = False
    ) -> tuple[RollbackStatus, int]:
        """Take back turn ``turn`` (the upstream refused it); ``(status, seq)`` as ROLLBACK.
        ``forget_new``: a session born with this turn is deleted, not kept as idle.

        Only the session's current, still active turn is taken back: if another turn started
        meanwhile, nothing changes (status 0) and the failed turn stays counted.
        """
        k = self.keys
        keys = [
            k.session(tenant, session),
            k.live(tenant),
            k.decision_seq,
            k.decisions,
            k.decision_table,
            k.decision_gc,
            k.gap_observations(tenant),
            k.waits,
        ]
        args = [
            repr(now),
            str(turn),
            session,
            scoped_session_id(tenant, session),
            str(self.limits.decision_stream_maxlen),
            "1" if forget_new else "0",
        ]
        raw = await self._call("rollback", lambda: self._scripts.call(self._rollback, keys, args))
        return RollbackStatus(int(raw[0])), int(raw[1])

    # --- guarded updates ----------------------------------------------------------------------

    async def apply(
        self,
        tenant: str,
        session: str,
        update: SessionUpdate,
        *,
        now: float,
        guard: tuple[str, str] | None = None,
        create: bool = False,
    ) -> tuple[ApplyStatus, int]:
        """Apply ``update`` atomically; returns ``(status, seq)`` as the APPLY script does."""
        k = self.keys
        skey = k.session(tenant, session)
        push_key, push_value = skey, ""
        if update.push is not None:
            which, push_value = update.push
            push_key = {"waits": k.waits, "suspensions": k.suspensions}[which]
        guard_field, guard_value = guard if guard is not None else ("", "*")
        if create:
            guard_field, guard_value = "version", ""
        keys = [
            skey,
            k.live(tenant),
            k.decision_seq,
            k.decisions,
            k.decision_table,
            k.decision_gc,
            push_key,
        ]
        ttl = update.ttl_s if update.ttl_s is not None else self.limits.session_ttl_s
        head, tail = decision_parts(update.decision) if update.decision is not None else (b"", b"")
        fields = update.fields
        args: list[str | bytes] = [
            repr(now),
            guard_field,
            guard_value,
            "=" if update.keep_live else _score(update.live_score),
            str(ttl),
            scoped_session_id(tenant, session),
            head,
            tail,
            str(self.limits.decision_stream_maxlen),
            session,
            push_value,
            str(self.limits.wait_samples_maxlen),
            "0" if create else "1",
            str(2 * len(fields)),
        ]
        for name, value in fields.items():
            args += (name, value)
        args += update.deleted
        raw = await self._call("apply", lambda: self._scripts.call(self._apply, keys, args))
        return ApplyStatus(int(raw[0])), int(raw[1])

    async def update_session(
        self,
        tenant: str,
        session: str,
        mutate: Callable[[SessionRecord], SessionUpdate],
        *,
        now: float,
        attempts: int = 8,
    ) -> tuple[SessionRecord, int]:
        """Read-modify-write one existing session, retrying if another writer got in first.

        Returns the record as read (before the update) and the decision's sequence number.
        A writer that lost the race waits a random, growing moment before it reads again:
        without it, writers that collided once (16 spawns under one parent) read and lose
        together again, and one of them ran out of attempts (a 503 for a spawn whose worker
        was already created).
        """
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(random.uniform(0.0, min(0.05, 0.002 * 2**attempt)))
            record = await self.get_session(tenant, session)
            if record is None:
                raise SessionNotFound(session)
            update = mutate(record)
            status, seq = await self.apply(
                tenant, session, update, now=now, guard=(RecordField.VERSION, record.version)
            )
            if status is ApplyStatus.APPLIED:
                return record, seq
            if status is ApplyStatus.MISSING:
                raise SessionNotFound(session)
        raise StateUnavailable("session is being updated concurrently; retry", retry_after_s=1)

    async def create_session(
        self, tenant: str, session: str, update: SessionUpdate, *, now: float
    ) -> int:
        status, seq = await self.apply(tenant, session, update, now=now, create=True)
        if status is ApplyStatus.EXISTS:
            raise SessionExists(session)
        return seq

    # --- reads ---------------------------------------------------------------------------------

    async def get_session(self, tenant: str, session: str) -> SessionRecord | None:
        key = self.keys.session(tenant, session)
        raw = await self._call("get_session", lambda: self.client.hgetall(key))
        if not raw:
            return None
        return SessionRecord.from_hash({text(f): text(v) for f, v in raw.items()})

    async def list_sessions(
        self, tenant: str, *, limit: int, offset: int = 0
    ) -> list[SessionRecord]:
        """Live sessions ordered by expected wake-up (soonest first)."""
        live = self.keys.live(tenant)
        ids: list[Any] = await self._call(
            "list_sessions",
            lambda: self.client.zrange(live, offset, offset + limit - 1),
        )
        if not ids:
            return []
        names = [text(i) for i in ids]

        async def fetch() -> list[Any]:
            async with self.client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hgetall(self.keys.session(tenant, name))
                return list(await pipe.execute())

        records = await self._call("list_sessions", fetch)
        out: list[SessionRecord] = []
        expired: list[str] = []
        for name, raw in zip(names, records, strict=True):
            if raw:
                out.append(SessionRecord.from_hash({text(f): text(v) for f, v in raw.items()}))
            else:
                expired.append(name)
        if expired:
            # Sessions that expired leave their index entry behind; tidy as we read.
            await self._call("list_sessions", lambda: self.client.zrem(live, *expired))
        return out

    async def count_live(self, tenant: str) -> int:
        live = self.keys.live(tenant)
        return int(await self._call("count_live", lambda: self.client.zcard(live)))

    async def recent_decisions(self, count: int) -> list[Decision]:
        stream = self.keys.decisions
        raw: Any = await self._call("decisions", lambda: self.client.xrevrange(stream, count=count))
        return [decode_decision(fields[b"d"]) for _id, fields in raw]

    async def decision_table(self) -> tuple[int, list[Decision]]:
        """The newest decision per session (the push snapshot) and the newest sequence number."""
        table, seq_key = self.keys.decision_table, self.keys.decision_seq

        async def fetch() -> list[Any]:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hgetall(table)
                pipe.get(seq_key)
                return list(await pipe.execute())

        rows, seq = await self._call("decision_table", fetch)
        decisions = sorted((decode_decision(body) for body in rows.values()), key=_seq_of)
        return int(seq or 0), decisions

    async def read_decisions(
        self, after_id: str, *, block_ms: int, count: int = 512
    ) -> list[tuple[str, Decision]]:
        """Decisions appended after stream id ``after_id`` (waits up to ``block_ms``)."""
        stream = self.keys.decisions
        raw: Any = await self._call(
            "tail_decisions",
            lambda: self.client.xread({stream: after_id}, count=count, block=block_ms),
        )
        out: list[tuple[str, Decision]] = []
        for _stream, entries in raw or []:
            for entry_id, fields in entries:
                out.append((text(entry_id), decode_decision(fields[b"d"])))
        return out

    async def last_decision_id(self) -> str:
        stream = self.keys.decisions
        raw: Any = await self._call(
            "tail_decisions", lambda: self.client.xrevrange(stream, count=1)
        )
        return text(raw[0][0]) if raw else "0-0"

    async def ping(self) -> bool:
        return bool(await self._call("ping", self.client.ping))

    # --- samples and the runtime config (off the per-request path) -----------------------

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
        """Recent observed suspension waits (``"waits"``, every tenant's), the SRE's
        calibration sample (``"calibration_waits"``) or suspension times (``"suspensions"``)."""
        key = {
            "waits": self.keys.waits,
            "calibration_waits": self.keys.calibration_waits,
            "suspensions": self.keys.suspensions,
        }[which]
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
        # Its own list: the observed waits list holds every tenant's resumes, and scoring a
        # tenant on it let one tenant's waits decide another's branch.
        key, limit = self.keys.calibration_waits, self.limits.wait_samples_maxlen

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


def _score(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _seq_of(decision: Decision) -> int:
    return decision.seq
