"""The sidecar's segment tracking: per-session state, the proxy's hooks, spawns and returns.

With ``TENURE_SEGMENTS=true`` every tracked request of an explicitly named session
(``X-Tenure-Session``; inferred sessions carry no segments) gets the segment fields of
``kv_transfer_params.tenure`` (:mod:`service.wire.segments`): its role, its parent and
the ranker's prediction for a worker, and the segments :func:`service.api.segments.split_turn`
finds. The proxy calls

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
tenant. The lifecycle API's side (spawns, returns, ends) is
:mod:`service.api.segments.lifecycle`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from service.api.segments.engine_calls import count_prompt
from service.api.segments.facts import ResponseFacts
from service.api.segments.lifecycle import TREE_DEPTH, SegmentLifecycle, SegmentRefused
from service.api.segments.spawns import SpawnFacts, predict
from service.api.segments.split import Split, split_turn
from service.api.segments.state import SegmentState
from service.policy.segments import SessionRole
from service.policy.spawn_context import human_turn, input_types
from service.state.breaker import StateUnavailable
from service.wire.segments import SegmentWireError, parse_segment_tags

__all__ = ["PendingTurn", "SegmentTracker"]

log = logging.getLogger(__name__)

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


class SegmentTracker(SegmentLifecycle):
    """The proxy's per-turn hooks: :meth:`admit`, :meth:`tags`, :meth:`record`."""

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
        task = asyncio.get_running_loop().create_task(
            self._record(pending, facts, last_turn, self.clock())
        )
        key = (pending.tenant, pending.session)
        self._recording[key] = task
        task.add_done_callback(lambda t: self._forget_record(key, t))
        return task

    def _forget_record(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._recording.get(key) is task:
            del self._recording[key]

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
