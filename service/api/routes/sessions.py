"""Lifecycle routes: end, suspend, resume, spawn workers and their return, read sessions
(tenant-scoped).

Each write is one guarded read-modify-write of the session record (retried on a concurrent
update) that also publishes the core's decision on the push channel. With Redis down every
route answers 503 with ``Retry-After`` (see the app's ``StateUnavailable`` handler).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query

from tenure.service.api.routes.deps import (
    ApiError,
    Services,
    error_responses,
    get_services,
    tenant_of,
)
from tenure.service.api.routes.session_views import (
    ID_PATTERN,
    SessionList,
    SessionView,
    SuspendRequest,
    WorkerSpawn,
    view,
)
from tenure.service.api.segments.spawns import SpawnFacts
from tenure.service.api.segments.tracker import SegmentRefused
from tenure.service.api.turns import decisions
from tenure.service.api.upstream.relay import forward_headers
from tenure.service.policy import lifecycle
from tenure.service.settings import TenantSpec
from tenure.service.state.records import SessionExists, SessionNotFound, SessionUpdate
from tenure.service.wire.session_record import RecordField, SessionRecord

__all__ = ["router"]

SessionId = Annotated[str, Path(pattern=ID_PATTERN, description="session id (tenant-scoped)")]

router = APIRouter(
    prefix="/v1/sessions",
    tags=["sessions"],
    responses=error_responses(400, 401, 404, 409, 413, 422, 503),
)


def _not_found(session: str) -> ApiError:
    return ApiError(404, f"session {session!r} not found", code="session_not_found")


class _Conflict(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


Svc = Annotated[Services, Depends(get_services)]
Tenant = Annotated[TenantSpec, Depends(tenant_of)]


Decide = Callable[[SessionRecord, float], lifecycle.LifecycleDecision]
Extra = Callable[[SessionRecord, SessionUpdate, float], None]


async def _transition(
    svc: Services,
    tenant: TenantSpec,
    session: str,
    decide: Decide,
    extra: Extra | None = None,
) -> SessionView:
    """Apply ``decide(record, now) -> LifecycleDecision`` to one session, publish, return it."""
    await svc.settled(tenant.name, session)
    now = svc.clock()
    outcome: dict[str, Any] = {}

    def mutate(record: SessionRecord) -> SessionUpdate:
        decision = decide(record, now)
        message = decisions.as_message(
            decision, tenant=tenant.name, session=session, turn=record.turn,
            parent=record.parent, now=now,
        )  # fmt: skip
        update = decisions.as_update(
            decision, message, now=now, session_ttl_s=svc.settings.session_ttl_s,
            finished_ttl_s=svc.settings.finished_ttl_s,
        )  # fmt: skip
        if extra is not None:
            extra(record, update, now)
        outcome["decision"] = decision
        outcome["update"] = update
        return update

    try:
        before, _seq = await svc.store.update_session(tenant.name, session, mutate, now=now)
    except SessionNotFound:
        raise _not_found(session) from None
    except _Conflict as exc:
        raise ApiError(409, exc.message, code="session_finished") from None
    decisions.count(svc.metrics, outcome["decision"])
    after = before.updated(outcome["update"].fields, outcome["update"].deleted)
    return view(session, after, now, svc.runtime.config.overdue_slack_s)


@router.post("/{session_id}/end", response_model=SessionView)
async def end_session(session_id: SessionId, svc: Svc, tenant: Tenant) -> SessionView:
    """Declare the session finished: its KV is reclaimed at once; the record expires later."""
    result = await _transition(svc, tenant, session_id, lambda _r, now: lifecycle.on_end(now))
    if svc.segments is not None:
        # Ending a spawned worker is its return: its segments close in the engine too.
        await svc.segments.end(tenant.name, session_id, result.turn, _engine_headers(svc))
    return result


@router.post("/{session_id}/return", response_model=SessionView)
async def worker_return(session_id: SessionId, svc: Svc, tenant: Tenant) -> SessionView:
    """A spawned worker (or reviewer) returned to its parent: it is finished, and with segment
    tracking on its KV segments close in the engine (its SSD files are deleted). ``/end`` on a
    live worker does the same; a worker's request marked as its last turn is its return too.

    409 for a lead session (it ends, it does not return), a worker that has returned already
    (on this route, or on a request marked as its last turn), or one whose own workers are live.
    """
    await svc.settled(tenant.name, session_id)
    record = await svc.store.get_session(tenant.name, session_id)
    if record is None:
        raise _not_found(session_id)
    state = None
    if svc.segments is not None:
        try:
            state = await svc.segments.check_return(tenant.name, session_id, record)
        except SegmentRefused as exc:
            raise ApiError(exc.status, exc.message, code=exc.code) from None
    elif not record.parent:
        raise ApiError(
            409,
            f"session {session_id!r} is a lead session; it ends, it does not return",
            code="not_a_worker",
        )
    elif record.state == "finished":
        raise ApiError(409, f"worker {session_id!r} returned twice", code="worker_returned")

    def decide(current: SessionRecord, now: float) -> lifecycle.LifecycleDecision:
        if current.state == "finished":
            raise _Conflict(f"worker {session_id!r} returned twice")
        return lifecycle.on_end(now)

    result = await _transition(svc, tenant, session_id, decide)
    if svc.segments is not None and state is not None:
        await svc.segments.returned(
            tenant.name, session_id, state, record.turn, _engine_headers(svc)
        )
    return result


def _engine_headers(svc: Services) -> list[tuple[bytes, bytes]]:
    """Headers of the sidecar's own calls to the engine (its key, never a caller's)."""
    key = svc.settings.upstream_api_key
    auth = f"Bearer {key.get_secret_value()}" if key is not None else None
    return forward_headers([], auth, drop_client_auth=True)


@router.post("/{session_id}/suspend", response_model=SessionView)
async def suspend_session(
    session_id: SessionId,
    svc: Svc,
    tenant: Tenant,
    body: Annotated[SuspendRequest | None, Body()] = None,
) -> SessionView:
    """A human-approval wait begins: the core picks host-retain or a host TTL t2(lambda)."""
    request = body or SuspendRequest()
    runtime = svc.runtime

    control = runtime.retention

    def decide(record: SessionRecord, now: float) -> lifecycle.LifecycleDecision:
        if record.state == "finished":
            raise _Conflict(f"session {session_id!r} is finished")
        # The tenant's online controller: its branch, its lambda, its share of C2, its rent
        # clock (the re-priced timer's limit), and the retention rule's scale of t2.
        branch, lam = control.suspend_inputs(tenant.name, runtime.config)
        return lifecycle.on_suspend(
            now, expected_wait_s=request.expected_wait_s,
            retention=control.settings(runtime.config), estimated_lambda=lam, branch=branch,
            declared_retention_s=record.retention_s, rent=control.rent(tenant.name),
            timer_scale=control.scale(tenant.name),
        )  # fmt: skip

    def extra(record: SessionRecord, update: SessionUpdate, now: float) -> None:
        update.fields[RecordField.SUSPENDED_AT] = repr(now)
        update.fields[RecordField.SUSPEND_REASON] = request.reason
        if request.expected_wait_s is not None:
            update.fields[RecordField.EXPECTED_WAIT_S] = repr(request.expected_wait_s)
        else:
            update.deleted.append(RecordField.EXPECTED_WAIT_S)

    result = await _transition(svc, tenant, session_id, decide, extra)
    if result.suspended_at is not None:
        await control.observe_suspension(tenant.name, result.suspended_at)
    return result


@router.post("/{session_id}/resume", response_model=SessionView)
async def resume_session(session_id: SessionId, svc: Svc, tenant: Tenant) -> SessionView:
    """The wait is over: the session's next turn is imminent."""

    def decide(record: SessionRecord, now: float) -> lifecycle.LifecycleDecision:
        if record.state == "finished":
            raise _Conflict(f"session {session_id!r} is finished")
        return lifecycle.on_resume(now)

    waited: dict[str, float] = {}

    def extra(record: SessionRecord, update: SessionUpdate, now: float) -> None:
        suspended_at = record.suspended_at
        if record.state == "suspended" and suspended_at is not None:
            # The observed approval wait is a calibration sample for the regime controller.
            update.push = ("waits", repr(max(0.0, now - suspended_at)))
            waited["at"], waited["wait"] = now, max(0.0, now - suspended_at)
        else:
            waited.clear()  # a retried update that no longer ends a suspension
        update.deleted.extend([RecordField.SUSPENDED_AT, RecordField.EXPECTED_WAIT_S])

    result = await _transition(svc, tenant, session_id, decide, extra)
    if waited:
        await svc.runtime.retention.observe_resume(tenant.name, waited["at"], waited["wait"])
    return result


@router.post("/{session_id}/workers", response_model=SessionView, status_code=201)
async def spawn_worker(
    session_id: SessionId, spawn: WorkerSpawn, svc: Svc, tenant: Tenant
) -> SessionView:
    """Spawn a sub-agent session whose parent is this one; returns the worker's session."""
    await svc.settled(tenant.name, session_id)
    now = svc.clock()
    parent = await svc.store.get_session(tenant.name, session_id)
    if parent is None:
        raise _not_found(session_id)
    if parent.state == "finished":
        raise ApiError(409, f"session {session_id!r} is finished", code="session_finished")
    decision = lifecycle.on_spawn(now, role=spawn.role)
    message = decisions.as_message(
        decision, tenant=tenant.name, session=spawn.worker_id, turn=0, parent=session_id, now=now
    )
    update = decisions.as_update(
        decision, message, now=now, session_ttl_s=svc.settings.session_ttl_s,
        finished_ttl_s=svc.settings.finished_ttl_s,
    )  # fmt: skip
    update.fields.update(
        {
            RecordField.ID: spawn.worker_id,
            RecordField.TURN: "0",
            RecordField.CREATED_AT: repr(now),
            RecordField.PARENT: session_id,
            RecordField.ROLE: spawn.role,
            RecordField.METADATA: json.dumps(spawn.metadata, default=str),
        }
    )
    try:
        await svc.store.create_session(tenant.name, spawn.worker_id, update, now=now)
    except SessionExists:
        raise ApiError(
            409, f"session {spawn.worker_id!r} already exists", code="session_exists"
        ) from None
    decisions.count(svc.metrics, decision)

    def add_worker(record: SessionRecord) -> SessionUpdate:
        workers = list(record.workers)
        if spawn.worker_id not in workers and len(workers) < 1024:
            workers.append(spawn.worker_id)
        return SessionUpdate(fields={RecordField.WORKERS: json.dumps(workers)}, keep_live=True)

    # If the parent expired in between, the worker still knows its parent.
    with contextlib.suppress(SessionNotFound):
        await svc.store.update_session(tenant.name, session_id, add_worker, now=now)
    created = SessionRecord.from_hash(update.fields)
    result = view(spawn.worker_id, created, now, svc.runtime.config.overdue_slack_s)
    if svc.segments is not None:
        facts = SpawnFacts(
            subagent_type=spawn.subagent_type,
            model=spawn.model,
            expected_tokens=spawn.expected_tokens,
            background=spawn.background,
        )
        try:
            state = await svc.segments.spawn(
                tenant.name, session_id, spawn.worker_id, spawn.role, facts, parent, now
            )
        except SegmentRefused as exc:  # the parent's record says finished first, in practice
            raise ApiError(exc.status, exc.message, code=exc.code) from None
        result.predicted_lifetime_s = state.predicted_lifetime_s
    return result


@router.get("/{session_id}", response_model=SessionView)
async def get_session(session_id: SessionId, svc: Svc, tenant: Tenant) -> SessionView:
    await svc.settled(tenant.name, session_id)
    record = await svc.store.get_session(tenant.name, session_id)
    if record is None:
        raise _not_found(session_id)
    return view(session_id, record, svc.clock(), svc.runtime.config.overdue_slack_s)


@router.get("", response_model=SessionList)
async def list_sessions(
    svc: Svc,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> SessionList:
    """The tenant's live sessions, soonest expected wake-up first."""
    records = await svc.store.list_sessions(tenant.name, limit=limit, offset=offset)
    now = svc.clock()
    slack = svc.runtime.config.overdue_slack_s
    return SessionList(
        sessions=[view(r.id, r, now, slack) for r in records],
        limit=limit,
        offset=offset,
    )
