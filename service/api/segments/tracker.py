"""The sidecar's segment tracking: per-session state, the proxy's hooks, spawns and returns.

With ``TENURE_SEGMENTS=true`` every tracked request of an explicitly named session
(``X-Tenure-Session``; inferred sessions carry no segments) gets the segment fields of
``kv_transfer_params.tenure`` (:mod:`tenure.service.wire.segments`): its role, its parent and
the ranker's prediction for a worker, and the segments
:func:`tenure.service.api.segments.split.split_turn` finds. The proxy calls

1. :meth:`SegmentTracker.admit` before the turn is counted: reads the session's state and
   refuses what the core would (a request of a worker that has returned, a first request naming
   an unknown or ended parent, a parent that disagrees with the recorded one), so a refused
   request stores nothing;
2. :meth:`SegmentTracker.tags` once the turn number is known: the split and the wire fields
   (checked with the wire's own parser);
3. :meth:`SegmentTracker.record` after the answer: the response's facts become the state for
   the next turn, with what a spawn under this session takes from its call (whether it
   answered a human message, the gap before it, when it ended); a last turn deletes the state
   (a worker's leaves a short-lived "returned" tombstone, so a second return is refused).

Redis down: no segments, the request goes on (fail open, as the turn itself). Segment ids and
Redis keys are the sidecar's own and tenant-scoped; a session can only name a parent of its own
tenant.

The lifecycle API's side (:meth:`SegmentTracker.spawn`, :meth:`~SegmentTracker.returned`,
:meth:`~SegmentTracker.end`): workers spawned and returned through the API, sessions ended, a
lead's live workers retired with it. Refusals are :class:`SegmentRefused` (status, message,
code, param), answered by the routes in the API's own error style. A spawn gives the ranker
what the replay derives from a trace (:func:`tenure.service.policy.spawn_context.parent_features`):
the parent's latest answered call, as its state records it, and its worker history, counted in
Redis (:meth:`~tenure.service.state.segment_store.SegmentStore.spawned` / ``returned``: a return
adds the worker's lifetime, spawn to return on this clock, to its parent's history). A spawn first
waits (bounded) for the parent's answer still being recorded, so it sees the call that spawned
it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tenure.service.api.segments.engine_calls import count_prompt, notify_return
from tenure.service.api.segments.facts import ResponseFacts
from tenure.service.api.segments.spawns import SpawnFacts, predict
from tenure.service.api.segments.split import Split, split_turn
from tenure.service.api.segments.state import SegmentState, StateDecodeError
from tenure.service.api.upstream.client import UpstreamClient
from tenure.service.metrics import Metrics
from tenure.service.policy.ranker import WorkerRanker
from tenure.service.policy.segments import SessionRole
from tenure.service.policy.spawn_context import (
    human_turn,
    input_types,
    lifetime_log,
    parent_features,
)
from tenure.service.settings import Settings
from tenure.service.state.breaker import StateUnavailable
from tenure.service.state.keys import scoped_session_id
from tenure.service.state.segment_store import SegmentStore
from tenure.service.state.store import StateStore
from tenure.service.wire.segments import SegmentWireError, parse_segment_tags
from tenure.service.wire.session_record import SessionRecord

__all__ = ["TREE_DEPTH", "PendingTurn", "SegmentRefused", "SegmentTracker"]

log = logging.getLogger(__name__)

#: How deep an ended lead's tree of workers is walked to retire them.
TREE_DEPTH = 4
#: How long a spawn waits for its parent's answer to be recorded (read your own writes).
RECORD_WAIT_S = 2.0


class SegmentRefused(Exception):
    """A request or lifecycle call the segment rules refuse: status, message, code, param."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def _role(name: str) -> SessionRole:
    return SessionRole.REVIEWER if name == "reviewer" else SessionRole.WORKER


#: (tenant, model) pairs remembered as reasoning models (a new session of one expects it).
_MODELS_REMEMBERED = 1024
_MODEL_NAME_MAX = 256


@dataclass(slots=True)
class PendingTurn:
    """A tracked request's segment bookkeeping between :meth:`admit` and :meth:`record`."""

    tenant: str
    session: str
    state: SegmentState
    model: str
    messages: list[Any] | None
    split: Split | None = None
    turn: int = 0
    #: When the request arrived (the sidecar's clock): the gap before it ends here.
    started_at: float = 0.0
    #: Its new input has user text, not only tool results (chat or Anthropic messages).
    human: bool = False


class SegmentTracker:
    """Segment tracking of one app: the proxy's per-turn hooks (:meth:`admit`, :meth:`tags`,
    :meth:`record`) and the lifecycle API's spawns, returns and ends, over the state they
    share."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        upstream: UpstreamClient,
        metrics: Metrics,
        ranker: WorkerRanker,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.sessions = store
        self.store = SegmentStore(store)
        self.upstream = upstream
        self.metrics = metrics
        self.ranker = ranker
        #: (tenant, model) pairs seen to reason, most recent last (the per-turn hooks' memory).
        self._reasoning_models: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.clock = clock
        #: (tenant, session) -> the task recording its latest answer, while it runs.
        self._recording: dict[tuple[str, str], asyncio.Task[None]] = {}

    # --- the lifecycle API ---------------------------------------------------------------

    async def spawn(
        self,
        tenant: str,
        parent: str,
        worker: str,
        role: str,
        spawn: SpawnFacts,
        parent_record: SessionRecord,
        now: float,
    ) -> SegmentState:
        """A worker spawned through the API: its role, parent and the ranker's prediction."""
        await self._settled(tenant, parent)
        parent_state = await self._load(tenant, parent)
        if parent_state is not None and parent_state.returned:
            raise SegmentRefused(
                409, f"session {parent!r} has returned; it spawns no workers", "worker_returned"
            )
        facts = await self._spawn_facts(
            tenant, parent, parent_state, parent_record, worker, spawn, now
        )
        state = SegmentState(
            role=_role(role),
            parent=parent,
            predicted_lifetime_s=predict(self.ranker, facts),
            expected_tokens=spawn.expected_tokens or None,
            model=spawn.model,
            spawned_at=now,
        )
        await self.store.put(tenant, worker, state.to_json(), self.settings.session_ttl_s)
        return state

    async def check_return(self, tenant: str, worker: str, record: SessionRecord) -> SegmentState:
        """What a worker's return needs, or :class:`SegmentRefused` (nothing changed)."""
        state = await self._load(tenant, worker)
        if state is None:
            parent = record.parent
            if parent is None:
                raise SegmentRefused(
                    409,
                    f"session {worker!r} is a lead session; it ends, it does not return",
                    "not_a_worker",
                )
            state = SegmentState(role=_role(record.role or ""), parent=parent)
        if state.role is SessionRole.LEAD:
            raise SegmentRefused(
                409,
                f"session {worker!r} is a lead session; it ends, it does not return",
                "not_a_worker",
            )
        if state.returned or record.state == "finished":
            raise SegmentRefused(409, f"worker {worker!r} returned twice", "worker_returned")
        live = await self._live_children(tenant, record)
        if live:
            raise SegmentRefused(
                409,
                f"worker {worker!r} cannot return while its own workers {live[:8]} are live",
                "boundary_order",
            )
        return state

    async def returned(
        self,
        tenant: str,
        worker: str,
        state: SegmentState,
        turn: int,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> bool:
        """Mark the return (a tombstone until the finished TTL) and tell the engine; returns
        whether the engine took the notice (False also when it never saw the worker)."""
        done = replace(state, returned=True)
        await self.store.put(tenant, worker, done.to_json(), self.settings.finished_ttl_s)
        await self._count_return(tenant, state)
        if turn <= 0 or not state.model:
            return False
        tenure = {
            "session_id": scoped_session_id(tenant, worker),
            "turn": turn + 1,
            "last_turn": True,
            **self._identity(tenant, state),
        }
        return await notify_return(self.upstream, state.model, tenure, headers)

    async def end(
        self, tenant: str, session: str, turn: int, headers: Sequence[tuple[bytes, bytes]]
    ) -> None:
        """The session ended through the API: a lead's state goes; ending a live worker is its
        return (the engine is told, a tombstone stays)."""
        try:
            state = await self._load(tenant, session)
            if state is None or state.role is SessionRole.LEAD:
                await self.store.delete(tenant, session)
                await self._retire_children(tenant, session, TREE_DEPTH)
            elif not state.returned:
                await self.returned(tenant, session, state, turn, headers)
        except StateUnavailable:
            return

    # --- internals --------------------------------------------------------------------------

    async def _spawn_facts(
        self,
        tenant: str,
        parent: str,
        parent_state: SegmentState | None,
        parent_record: SessionRecord,
        worker: str,
        spawn: SpawnFacts,
        now: float,
    ) -> SpawnFacts:
        """The spawn's own facts plus its parent's, derived as the replay derives them; the
        worker is counted in its parent's history, atomically with the read (once: a first
        request retried gets its first place back)."""
        call = parent_state.parent_call() if parent_state is not None else None
        turn = parent_state.turn if parent_state is not None else 0
        ttl = self.settings.session_ttl_s
        spawned = await self.store.spawned(tenant, parent, worker, turn, ttl)
        return replace(
            spawn,
            session_elapsed_s=max(0.0, now - (parent_record.created_at or now)),
            # Siblings spawned since the parent's call: a lower bound on the fan-out (the
            # replay sees the whole group, a live spawn only those before it).
            fanout=spawned.sibling_index + 1,
            sibling_index=spawned.sibling_index,
            **parent_features(call, spawned.history),
        )

    async def _count_return(self, tenant: str, state: SegmentState) -> None:
        """A worker returned: its lifetime joins its parent's history. (Two concurrent returns
        of one worker could both count; the second is refused everywhere else.)"""
        if state.parent is None or state.spawned_at is None or state.role is SessionRole.LEAD:
            return
        lifetime = max(0.0, self.clock() - state.spawned_at)
        await self.store.returned(tenant, state.parent, lifetime_log(lifetime))

    async def _settled(self, tenant: str, session: str) -> None:
        task = self._recording.get((tenant, session))
        if task is not None:
            await asyncio.wait({task}, timeout=RECORD_WAIT_S)

    def _identity(self, tenant: str, state: SegmentState) -> dict[str, Any]:
        out: dict[str, Any] = {"role": state.role.value}
        if state.role is not SessionRole.LEAD and state.parent is not None:
            out["parent_session"] = scoped_session_id(tenant, state.parent)
            if state.predicted_lifetime_s is not None:
                out["predicted_lifetime_s"] = state.predicted_lifetime_s
            if state.expected_tokens is not None:
                out["expected_tokens"] = state.expected_tokens
        return out

    async def _load(self, tenant: str, session: str) -> SegmentState | None:
        raw = await self.store.get(tenant, session)
        if raw is None:
            return None
        try:
            return SegmentState.from_json(raw)
        except StateDecodeError:
            log.warning("unreadable segment state of a session; starting it over")
            return None

    async def _retire_children(self, tenant: str, session: str, depth: int) -> None:
        """A lead ended: the engine ends its live workers with it; their states become
        tombstones that expire with finished sessions (nothing stays for the session TTL)."""
        if depth <= 0:
            return
        record = await self.sessions.get_session(tenant, session)
        for child in _children(record):
            state = await self._load(tenant, child)
            if state is not None and not state.returned:
                done = replace(state, returned=True)
                await self.store.put(tenant, child, done.to_json(), self.settings.finished_ttl_s)
                await self._retire_children(tenant, child, depth - 1)

    async def _live_children(self, tenant: str, record: SessionRecord) -> list[str]:
        live = []
        for child in _children(record):
            child_record = await self.sessions.get_session(tenant, child)
            if child_record is not None and child_record.state != "finished":
                child_state = await self._load(tenant, child)
                if child_state is None or not child_state.returned:
                    live.append(child)
        return live

    # --- the proxy's hooks -----------------------------------------------------------------

    async def admit(
        self, tenant: str, session: str, parent: str | None, payload: dict[str, Any], chat: bool
    ) -> PendingTurn | None:
        """The session's state for this request, or :class:`SegmentRefused`; None: Redis is
        unavailable (the request goes on without segments)."""
        # A request right after an answer (an instant tool) must see that answer's record.
        await self._settled(tenant, session)
        try:
            state = await self._load(tenant, session)
            if state is None:
                state = await self._new_state(tenant, session, parent)
        except StateUnavailable:
            return None
        if state.returned:
            raise SegmentRefused(
                409,
                f"worker session {session!r} has returned; it takes no more turns",
                "worker_returned",
                "X-Tenure-Session",
            )
        if parent is not None and parent != state.parent:
            raise SegmentRefused(
                400,
                f"X-Tenure-Parent {parent!r} disagrees with session {session!r}'s parent "
                f"({state.parent or 'none: it is a lead'})",
                "parent_mismatch",
                "X-Tenure-Parent",
            )
        model = payload.get("model")
        sent = payload.get("messages")
        messages = sent if chat else None
        return PendingTurn(
            tenant,
            session,
            state,
            model if isinstance(model, str) else "",
            messages if isinstance(messages, list) else None,
            started_at=self.clock(),
            human=human_turn(input_types(sent if isinstance(sent, list) else None)),
        )

    async def tags(
        self,
        pending: PendingTurn,
        turn: int,
        payload: dict[str, Any],
        headers: Sequence[tuple[bytes, bytes]],
        reasoning_hint: bool | None,
    ) -> dict[str, Any]:
        """The segment fields of this request's ``kv_transfer_params.tenure``."""
        state = pending.state
        expected = reasoning_hint
        if expected is None:
            expected = state.reasons or (pending.tenant, pending.model) in self._reasoning_models
        # The generation is declared only where the engine offloads generated blocks.
        expected = expected and self.settings.segment_tokenize
        prompt_tokens: int | None = None
        if expected and pending.messages is not None:
            prompt_tokens = await count_prompt(self.upstream, payload, headers)
        split = split_turn(
            state,
            pending.messages,
            turn,
            reasoning_expected=expected,
            prompt_tokens=prompt_tokens,
        )
        if expected:
            outcome = (
                "exact" if prompt_tokens is not None else "lower_bound" if split.gen else "none"
            )
            self.metrics.segment_prompt_counts.labels(outcome).inc()
        self.metrics.segment_splits.labels(split.verdict).inc()
        pending.split, pending.turn = split, turn
        out = self._identity(pending.tenant, state)
        out["segments"] = split.wire()
        try:
            parse_segment_tags(out)  # what the engine will parse; the sidecar built it
        except SegmentWireError as exc:
            raise SegmentRefused(400, f"segments: {exc}", "invalid_segments") from None
        return out

    def record(
        self, pending: PendingTurn, facts: ResponseFacts | None, *, last_turn: bool
    ) -> asyncio.Task[None]:
        """The turn was answered: store what the next turn needs (off the response path; a
        spawn under this session waits for it, see ``_settled``)."""
        key = (pending.tenant, pending.session)
        task = asyncio.get_running_loop().create_task(
            self._record_after(self._recording.get(key), pending, facts, last_turn, self.clock())
        )
        self._recording[key] = task
        task.add_done_callback(lambda t: self._forget_record(key, t))
        return task

    def _forget_record(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._recording.get(key) is task:
            del self._recording[key]

    async def _record_after(
        self,
        previous: asyncio.Task[None] | None,
        pending: PendingTurn,
        facts: ResponseFacts | None,
        last_turn: bool,
        ended_at: float,
    ) -> None:
        """Record after the session's previous answer is recorded: one session's writes land
        in answer order. A request that stopped waiting for the previous record (a loaded
        machine outran ``RECORD_WAIT_S``) would otherwise have its write overwritten by the
        older one, putting the session back a turn for every spawn that follows (seen in a
        run beside a replay ladder: a spawn read its parent three turns behind)."""
        if previous is not None and not previous.done():
            # Bounded by the previous write's own Redis timeouts; it never raises (see below).
            await asyncio.wait({previous})
        await self._record(pending, facts, last_turn, ended_at)

    async def _record(
        self, pending: PendingTurn, facts: ResponseFacts | None, last_turn: bool, ended_at: float
    ) -> None:
        state, split = pending.state, pending.split
        if split is None:
            return
        model_ok = 0 < len(pending.model) <= _MODEL_NAME_MAX
        if facts is not None and facts.reasoning_digest is not None and model_ok:
            key = (pending.tenant, pending.model)
            self._reasoning_models[key] = None
            self._reasoning_models.move_to_end(key)
            while len(self._reasoning_models) > _MODELS_REMEMBERED:
                self._reasoning_models.popitem(last=False)
        try:
            if last_turn and state.role is SessionRole.LEAD:
                await self.store.delete(pending.tenant, pending.session)
                await self._retire_children(pending.tenant, pending.session, TREE_DEPTH)
                return
            gen_start = facts.prompt_tokens if facts is not None else None
            if gen_start is None and split.gen is not None:
                gen_start = split.gen.start
            gap = 0.0 if state.ended_at is None else pending.started_at - state.ended_at
            new = replace(
                state,
                model=pending.model or state.model,
                reasons=state.reasons or (facts is not None and facts.reasoning_digest is not None),
                turn=pending.turn,
                messages=len(pending.messages or ()),
                gen_id=None if split.gen is None else split.gen.id,
                gen_start=gen_start,
                spans=list(split.spans),
                facts=facts,
                returned=last_turn,
                human=pending.human,
                gap_s=max(0.0, gap),
                ended_at=ended_at,
            )
            ttl = self.settings.finished_ttl_s if last_turn else self.settings.session_ttl_s
            await self.store.put(pending.tenant, pending.session, new.to_json(), ttl)
            if last_turn:
                await self._count_return(pending.tenant, state)
        except StateUnavailable:
            return
        except Exception:
            log.exception("recording a turn's segments failed")

    async def _new_state(self, tenant: str, session: str, parent: str | None) -> SegmentState:
        """A new session's state; a worker's first request (naming its parent) is its spawn:
        counted in the parent's history then (a retry of it counts once)."""
        if parent is None:
            return SegmentState()
        if parent == session:
            raise SegmentRefused(
                400, "a session cannot be its own parent", "unknown_parent", "X-Tenure-Parent"
            )
        await self._settled(tenant, parent)
        parent_state = await self._load(tenant, parent)
        record = await self.sessions.get_session(tenant, parent)
        if record is None:
            raise SegmentRefused(
                404,
                f"spawn of {session!r} under unknown parent session {parent!r}",
                "unknown_parent",
                "X-Tenure-Parent",
            )
        if record.state == "finished" or (parent_state is not None and parent_state.returned):
            raise SegmentRefused(
                409,
                f"spawn of {session!r} under parent {parent!r}, which has ended",
                "parent_ended",
                "X-Tenure-Parent",
            )
        now = self.clock()
        facts = await self._spawn_facts(
            tenant, parent, parent_state, record, session, SpawnFacts(), now
        )
        return SegmentState(
            role=SessionRole.WORKER,
            parent=parent,
            predicted_lifetime_s=predict(self.ranker, facts),
            spawned_at=now,
        )


def _children(record: SessionRecord | None) -> list[str]:
    if record is None:
        return []
    return record.workers[:1024]
