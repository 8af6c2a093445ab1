"""Turn bookkeeping: a tracked request's one Redis call, and the record of how its turn ended.

The proxy (:mod:`tenure.service.api.proxy.pipeline`) relays bytes; this book decides what a turn is.
At the start, one ``turn_start`` script call resolves (or infers) the session and counts the turn
(early-forwarded while the call runs when this replica can forecast the number,
:mod:`tenure.service.api.turns.forecasts`); with Redis down the turn is
:class:`~tenure.service.state.store.Uncounted` and goes upstream fail-open. At the end, off the
response path, the stop reason, tool and predicted gap are written with the turn as guard,
or, when the upstream never took the request, the turn is taken back (``rollback_turn``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenure.service.api.hints.harness import likely_end
from tenure.service.api.hints.tenure import HintError, Hints
from tenure.service.api.segments.facts import ResponseFacts, StreamFacts
from tenure.service.api.segments.tracker import PendingTurn as SegmentTurn
from tenure.service.api.segments.tracker import SegmentTracker
from tenure.service.api.turns import decisions
from tenure.service.api.turns.forecasts import TurnForecasts
from tenure.service.api.turns.recorder import PendingTurn, Recorder
from tenure.service.api.turns.runtime import Runtime
from tenure.service.harness.profiles import HarnessReading
from tenure.service.metrics import Metrics
from tenure.service.policy import lifecycle, stop_class
from tenure.service.policy.ranker import HeuristicRanker, SpawnRecord
from tenure.service.settings import Settings, TenantSpec
from tenure.service.state import aliases
from tenure.service.state.breaker import StateUnavailable
from tenure.service.state.records import TurnStart, Uncounted
from tenure.service.state.scripts import ApplyStatus, RollbackStatus
from tenure.service.state.store import StateStore
from tenure.service.wire.session_record import RecordField

__all__ = ["CUT", "FAILED", "OK", "Turn", "TurnBook"]

log = logging.getLogger("tenure.service.api.proxy.pipeline")

#: How a forwarded turn ended, for the record: the upstream answered it (``OK``), answered
#: and then the stream was cut (``CUT``: the turn counts, the session is not finished), or
#: never took it (``FAILED``: the turn is taken back).
OK, CUT, FAILED = "ok", "cut", "failed"


@dataclass(slots=True)
class Turn:
    """A tracked request: what the end-of-turn decision needs."""

    tenant: str
    session: str
    #: The number forwarded upstream: Redis's count, or this replica's forecast of it.
    turn: int
    hints: Hints
    parent: str | None
    #: Redis's answer (:class:`Uncounted` when Redis was down: forwarded fail-open, ``turn``
    #: 0); None while an early-forwarded turn's script is still in flight.
    start: TurnStart | Uncounted | None
    counting: asyncio.Task[TurnStart | Uncounted | None] | None = None
    stop_reason: str | None = None
    #: The stream carried the answer's end (its finish reason or terminal event): a client
    #: that leaves after it has its whole answer, even before the engine closed the stream.
    answered: bool = False
    tool: str | None = None
    #: The answer's own id where the API has one (``/v1/responses``), for chaining.
    answer_id: str | None = None
    #: The shape's typed reading of the request (``Prepared.info``).
    info: Any = None
    #: Segment tracking (``TENURE_SEGMENTS``): the turn's bookkeeping and its response's facts.
    segments: SegmentTurn | None = None
    facts: ResponseFacts | None = None
    stream: StreamFacts | None = None
    #: While recording (tenure.service.api.turns.recorder): the request side, and the answer's
    #: usage.
    record: PendingTurn | None = None
    usage: dict[str, int] | None = None
    #: What the harness's own fields said (tenure.service.harness.profiles), and whether the
    #: tenant lets a run's end be inferred from them.
    harness: HarnessReading | None = None
    infer_end: bool = True
    #: The session is one the sidecar named (a Responses request with no key): if its first
    #: turn is taken back, no client can ever continue it, so its record goes too.
    sidecar_named: bool = False

    @property
    def recording(self) -> bool:
        """Whether the answer's usage is wanted (the turn is being recorded)."""
        return self.record is not None


def _clean_tool(name: str | None) -> str:
    if not name:
        return ""
    # "|" separates fields of the gap log; control characters never belong in a tool name.
    return "".join("_" if c == "|" or c < " " else c for c in name[:128])


class TurnBook:
    """Counts turns in Redis and records their ends (one per proxy, on the app's loop)."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        runtime: Runtime,
        metrics: Metrics,
        clock: Callable[[], float],
        recorder: Recorder | None = None,
        segments: SegmentTracker | None = None,
    ) -> None:
        self.settings = settings
        self.segments = segments
        self.recorder = recorder
        self.store = store
        self.runtime = runtime
        self.metrics = metrics
        self.clock = clock
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[Any]] = set()
        #: ``(tenant, answer id)`` -> the end-of-turn write that will record its session.
        self.answers_pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        #: ``(tenant, session)`` -> its latest turn's end-of-turn write, while in flight.
        self.ends_pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._forecasts = TurnForecasts() if settings.early_forward else None
        self._early = {
            outcome: metrics.early_forwards.labels(outcome)
            for outcome in ("confirmed", "wrong_turn", "state_unavailable")
        }
        #: A lead waiting for a harness's sub-agent waits about a worker's lifetime.
        self._child_lifetime = HeuristicRanker()

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for pending end-of-turn writes (shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a background task until it is done (and let ``drain`` wait for it)."""
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def start(self, tenant: TenantSpec, hints: Hints, digests: list[str]) -> Turn | None:
        """Count the turn of a tracked request (``digests``: the prefix digests a session no
        key names is inferred from); None: untracked (nothing names or infers a session)."""
        if hints.session is None and not digests:
            if hints.any:
                raise HintError(
                    "X-Tenure-Session", "tenure hints need a session id (X-Tenure-Session)"
                )
            return None  # no hints, nothing to infer: plain pass-through
        now = self.clock()
        forecast: int | None = None
        forecasting = (
            hints.session is not None
            and self._forecasts is not None
            and not self.store.breaker.is_open
        )
        if forecasting:
            assert self._forecasts is not None and hints.session is not None
            forecast = self._forecasts.reserve(tenant.name, hints.session)
        counting = self._count_turn(tenant, hints, digests, now, forecasting, forecast)
        if forecast is not None:
            assert hints.session is not None
            # Early forward: the request goes upstream now, the turn's script meanwhile.
            task = self._loop.create_task(counting)
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return Turn(tenant.name, hints.session, forecast, hints, hints.parent, None, task)
        start = await counting
        if start is None:
            return None  # an inferred session cannot be named without Redis
        turn = 0 if isinstance(start, Uncounted) else start.turn
        return Turn(tenant.name, start.session, turn, hints, hints.parent, start)

    async def _count_turn(
        self,
        tenant: TenantSpec,
        hints: Hints,
        digests: list[str],
        now: float,
        forecasting: bool,
        forecast: int | None,
    ) -> TurnStart | Uncounted | None:
        """The turn's one Redis call and what follows from its answer; None without Redis.

        Everything here runs after the upstream send for an early-forwarded turn, so the
        decision is made here too, not on the way to the upstream.
        """
        # Published only for a new or resumed session, and never as a last turn: that is decided
        # when the turn ends, and only if the upstream took the request.
        decision = lifecycle.on_request(now, last_turn=False, hinted_gap_s=hints.expected_gap_s)
        message = decisions.as_message(
            decision, tenant=tenant.name, session="", turn=0, parent=None, now=now
        )
        counted: int | None = None
        start: TurnStart | Uncounted
        try:
            start = await self.store.turn_start(
                tenant.name,
                session=hints.session,
                prefix_digests=digests,
                new_session_id=f"auto-{digests[0][:24]}" if digests else "",
                segment=hints.segment,
                parent=hints.parent,
                last_turn=hints.last_turn,
                decision=message,
                now=now,
            )
            counted = start.turn
        except StateUnavailable:
            self.metrics.fail_open.inc()
            if hints.session is None:
                return None
            start = Uncounted(hints.session)
        finally:
            if forecasting:
                assert self._forecasts is not None and hints.session is not None
                right = self._forecasts.settle(tenant.name, hints.session, forecast, counted)
                if forecast is not None:
                    outcome = "state_unavailable" if counted is None else "confirmed"
                    self._early[outcome if right else "wrong_turn"].inc()
        if isinstance(start, Uncounted):
            return start
        if start.seq:
            decisions.count(self.metrics, decision)
        if start.inferred:
            self.metrics.sessions_inferred.inc()
        observation = start.observation
        if observation is not None:
            self.runtime.observe_gap(
                tenant.name, observation.stop_reason, observation.tool, observation.gap_s,
                observation.expected_s,
            )  # fmt: skip
        return start

    def child_started(self, turn: Turn) -> None:
        """A harness's sub-agent sent a request: on its first turn, its lead waits for it."""
        if turn.parent is None or turn.harness is None or not turn.harness.subagent:
            return
        if turn.turn == 1 or turn.counting is not None:
            self.keep(self._loop.create_task(self._lead_waits(turn)))

    async def _lead_waits(self, turn: Turn) -> None:
        start = turn.start
        if turn.counting is not None:
            try:
                start = await turn.counting
            except Exception:
                return  # said where the count is awaited (the end of the turn)
        if start is None or isinstance(start, Uncounted) or start.turn != 1:
            return
        assert turn.parent is not None
        lifetime = self._child_lifetime.predict_lifetime_s(SpawnRecord(subagent_type=""))
        await self._decide_lead(
            turn.tenant, turn.parent,
            lambda now: lifecycle.on_awaiting_child(now, child_lifetime_s=lifetime),
            unless_reason="child_returned",  # a child that answered at once came first
        )  # fmt: skip

    async def _decide_lead(
        self,
        tenant: str,
        lead: str,
        decide: Callable[[float], lifecycle.LifecycleDecision],
        unless_reason: str = "",
    ) -> None:
        """A decision for a lead idle between its turns, guarded by its turn number (a lead
        that has moved on keeps its own newer decision)."""
        await self.settled(tenant, lead)
        try:
            record = await self.store.get_session(tenant, lead)
            if record is None or record.state != "idle" or not record.turn:
                return
            if unless_reason and record.reason == unless_reason:
                return
            now = self.clock()
            decision = decide(now)
            message = decisions.as_message(
                decision, tenant=tenant, session=lead, turn=record.turn, parent=record.parent,
                now=now,
            )  # fmt: skip
            update = decisions.as_update(
                decision, message, now=now, session_ttl_s=self.settings.session_ttl_s,
                finished_ttl_s=self.settings.finished_ttl_s,
            )  # fmt: skip
            status, _seq = await self.store.apply(
                tenant, lead, update, now=now, guard=(RecordField.TURN, str(record.turn))
            )
        except StateUnavailable:
            return
        except Exception:
            log.exception("updating a lead for its sub-agent failed")
            return
        if status is ApplyStatus.APPLIED:
            decisions.count(self.metrics, decision)

    def finish(self, turn: Turn | None, outcome: str) -> None:
        if turn is None or turn.turn == 0:
            return  # untracked, or forwarded fail-open: there is no record to update
        if turn.segments is not None and outcome == OK and self.segments is not None:
            facts = turn.facts if turn.stream is None else turn.stream.facts()
            self.keep(self.segments.record(turn.segments, facts, last_turn=turn.hints.last_turn))
        if turn.record is not None and self.recorder is not None and outcome != FAILED:
            # Now, not in the task below: a request continuing this answer may come first.
            self.recorder.answered(turn.record, turn.tenant, turn.answer_id, turn.usage or {})
        task = self._loop.create_task(self._record_turn_end(turn, outcome))
        self.keep(task)
        # The answer has gone out before its record is written; a lifecycle call that follows
        # it (GET the session, end, suspend) waits for the write first (see ``settled``).
        session_key = (turn.tenant, turn.session)
        self.ends_pending[session_key] = task
        task.add_done_callback(lambda t: self._forget_end(session_key, t))
        if turn.answer_id is not None and outcome != FAILED:
            # A client may chain to this answer before its record is written: see
            # Proxy._chained.
            key = (turn.tenant, turn.answer_id)
            self.answers_pending[key] = task
            task.add_done_callback(lambda _t: self.answers_pending.pop(key, None))

    def _forget_end(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self.ends_pending.get(key) is task:
            del self.ends_pending[key]

    async def settled(self, tenant: str, session: str, timeout_s: float = 2.0) -> None:
        """Wait (bounded) for the end-of-turn write of ``session``'s answered turn, so that
        what a client does after an answer sees that turn recorded (read your own writes)."""
        task = self.ends_pending.get((tenant, session))
        if task is not None:
            await asyncio.wait({task}, timeout=timeout_s)

    async def _record_turn_end(self, turn: Turn, outcome: str) -> None:
        start = turn.start
        if turn.counting is not None:
            # An early-forwarded turn: Redis may still be counting it while the answer is
            # already here; what follows needs its number.
            try:
                start = await turn.counting
            except Exception:  # a bug there: say so here, where the result was awaited
                log.exception("counting an early-forwarded turn failed")
                return
        if start is None or isinstance(start, Uncounted) or start.turn == 0:
            return  # Redis did not count the turn: there is no record to update
        if outcome == FAILED:
            await self._take_back(turn, start)
            return
        now = self.clock()
        hints = turn.hints
        ended = None
        if outcome == OK and not hints.last_turn and hints.expected_gap_s is None:
            ended = likely_end(turn.harness, turn.stop_reason, now, enabled=turn.infer_end)
        if turn.record is not None and self.recorder is not None:
            # Its own task: recording never delays the turn's decision.
            task = self._loop.create_task(
                self.recorder.finish(
                    turn.record, tenant=turn.tenant, session=start.session, turn=start.turn,
                    stop=turn.stop_reason, usage=turn.usage, cut=outcome == CUT,
                    likely_end=ended is not None,
                )
            )  # fmt: skip
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        decision = lifecycle.on_response(
            now,
            stop_reason=turn.stop_reason,
            # A cut stream is not the declared end of the session.
            last_turn=hints.last_turn and outcome == OK,
            hinted_gap_s=hints.expected_gap_s,
            predictor=self.runtime.predictor(turn.tenant),
            tool=turn.tool,
        )
        if ended is not None:
            decision = ended
        message = decisions.as_message(
            decision, tenant=turn.tenant, session=start.session, turn=start.turn,
            parent=turn.parent, now=now,
        )  # fmt: skip
        update = decisions.as_update(
            decision,
            message,
            now=now,
            session_ttl_s=self.settings.session_ttl_s,
            finished_ttl_s=self.settings.finished_ttl_s,
        )
        update.fields[RecordField.LAST_END] = repr(now)
        update.fields[RecordField.STOP_REASON] = turn.stop_reason or ""
        update.fields[RecordField.TOOL] = _clean_tool(turn.tool)
        # The turn's declared retention bounds the session's next suspension's host TTL; a
        # turn that declares none clears it (never act on a stale hint).
        if hints.retention_s is not None:
            update.fields[RecordField.RETENTION_S] = repr(float(hints.retention_s))
        else:
            update.deleted.append(RecordField.RETENTION_S)
        try:
            status, _seq = await self.store.apply(
                turn.tenant,
                start.session,
                update,
                now=now,
                guard=(RecordField.TURN, str(start.turn)),
            )
        except StateUnavailable:
            return
        except Exception:  # a bug here must not take the event loop's task down silently
            log.exception("recording the end of a turn failed")
            return
        if turn.answer_id is not None:
            await self._remember_answer(turn, start.session)
        subagent = turn.harness is not None and turn.harness.subagent
        if ended is not None and subagent and turn.parent is not None:
            # The child answered its lead: the lead's next request is due now.
            await self._decide_lead(turn.tenant, turn.parent, lifecycle.on_child_returned)
        if status is ApplyStatus.APPLIED:
            decisions.count(self.metrics, decision)
            if decision.expected_gap_s is not None:
                self.metrics.gap_predicted.labels(stop_class(turn.stop_reason)).observe(
                    decision.expected_gap_s
                )

    async def _remember_answer(self, turn: Turn, session: str) -> None:
        """Let a later request chain to this answer (``previous_response_id``)."""
        assert turn.answer_id is not None
        try:
            await aliases.remember(
                self.store, turn.tenant, turn.answer_id, session, self.settings.session_ttl_s
            )
        except StateUnavailable:
            return
        except Exception:
            log.exception("recording an answer's session failed")

    async def _take_back(self, turn: Turn, start: TurnStart) -> None:
        try:
            status, _seq = await self.store.rollback_turn(
                turn.tenant, start.session, start.turn, now=self.clock(),
                forget_new=turn.sidecar_named,
            )  # fmt: skip
        except StateUnavailable:
            return
        except Exception:
            log.exception("taking back a failed turn failed")
            return
        taken_back = status is RollbackStatus.TAKEN_BACK
        self.metrics.failed_turns.labels("yes" if taken_back else "no").inc()
        if taken_back and self._forecasts is not None and turn.hints.session is not None:
            # Redis's count went back by one: this replica's forecast must not run ahead.
            self._forecasts.forget(turn.tenant, turn.hints.session)
