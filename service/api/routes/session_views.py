"""The lifecycle routes' request and response bodies (:mod:`tenure.service.api.routes.sessions`):
suspend and spawn requests with their bounds, the session view a stored record is read into.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tenure.service.policy import lifecycle
from tenure.service.wire.session_record import SessionRecord

__all__ = [
    "ID_PATTERN",
    "MAX_METADATA_DEPTH",
    "SessionList",
    "SessionView",
    "SuspendRequest",
    "WorkerSpawn",
    "json_depth",
    "view",
]

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
_MAX_WAIT_S = 30 * 86400.0
_MAX_METADATA_BYTES = 4096
#: Nesting allowed in worker metadata: enough for any label structure, far from the depth
#: where decoding or serialising a stored record would fail on every later read.
MAX_METADATA_DEPTH = 8


def json_depth(value: object, limit: int) -> int:
    """Nesting depth of a decoded JSON value, counted without recursion up to ``limit + 1``."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


class SuspendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(default="", max_length=256)
    #: Expected wait before the session resumes (a human approval), seconds.
    expected_wait_s: float | None = Field(default=None, ge=0, le=_MAX_WAIT_S, allow_inf_nan=False)


class WorkerSpawn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str = Field(pattern=ID_PATTERN)
    role: str = Field(default="worker", pattern=r"^[A-Za-z0-9_-]{1,32}$")
    metadata: dict[str, Any] = Field(default_factory=dict)
    #: Spawn metadata for the worker ranker (``TENURE_SEGMENTS``; all optional).
    subagent_type: str = Field(default="", pattern=r"^[A-Za-z0-9._ -]{0,64}$")
    model: str = Field(default="", max_length=256)
    expected_tokens: int = Field(default=0, ge=0, le=100_000_000)
    background: bool = False

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, Any]) -> dict[str, Any]:
        if json_depth(value, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
            raise ValueError(f"metadata must nest at most {MAX_METADATA_DEPTH} levels deep")
        if len(json.dumps(value, default=str)) > _MAX_METADATA_BYTES:
            raise ValueError(f"metadata must encode to at most {_MAX_METADATA_BYTES} bytes")
        return value


class SessionView(BaseModel):
    session_id: str
    state: str
    turn: int = 0
    created_at: float | None = None
    last_activity: float | None = None
    expected_gap_s: float | None = None
    wakeup_at: float | None = None
    eviction_class: str | None = None
    stop_reason: str | None = None
    tool: str | None = None
    last_turn: bool = False
    reason: str | None = None
    suspended_at: float | None = None
    suspend_reason: str | None = None
    expected_wait_s: float | None = None
    host_ttl_s: float | None = None
    #: The re-priced host timer: the copy expires when the tenant's rent clock (GPU-s,
    #: ``GET /admin/retention``) reaches this; ``host_ttl_s`` is it at the price when decided.
    host_rent_limit: float | None = None
    parent: str | None = None
    role: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    segments: list[str] = Field(default_factory=list)
    workers: list[str] = Field(default_factory=list)
    inferred: bool = False
    #: A spawned worker's lifetime as the ranker predicted it (segment tracking on).
    predicted_lifetime_s: float | None = None


class SessionList(BaseModel):
    sessions: list[SessionView]
    limit: int
    offset: int


def view(session: str, record: SessionRecord, now: float, slack_s: float) -> SessionView:
    state = record.state if record.state is not None else "idle"
    wakeup = record.wakeup_at
    cls = (
        lifecycle.classify(
            state,  # type: ignore[arg-type]
            wakeup,
            now,
            slack_s,
            likely_end=(record.reason or "").startswith(lifecycle.LIKELY_END),
        )
        if state in ("active", "idle", "suspended", "finished")
        else None
    )
    try:
        metadata = json.loads(record.metadata or "{}")
    except (ValueError, RecursionError):
        metadata = {}
    if json_depth(metadata, MAX_METADATA_DEPTH) > MAX_METADATA_DEPTH:
        # Stored before the depth limit (or by another writer): unreadable, not fatal.
        metadata = {}
    return SessionView(
        session_id=session,
        state=state,
        turn=record.turn,
        created_at=record.created_at,
        last_activity=record.last_activity,
        expected_gap_s=record.expected_gap_s,
        wakeup_at=wakeup,
        eviction_class=cls.value if cls is not None else None,
        stop_reason=record.stop_reason,
        tool=record.tool,
        last_turn=record.last_turn,
        reason=record.reason,
        suspended_at=record.suspended_at,
        suspend_reason=record.suspend_reason,
        expected_wait_s=record.expected_wait_s,
        host_ttl_s=record.host_ttl_s,
        # Only while suspended: a turn starting from the suspension keeps the field (a
        # refused turn's rollback restores the suspension with it) until the turn ends.
        host_rent_limit=record.host_rent_limit if record.state == "suspended" else None,
        parent=record.parent,
        role=record.role,
        metadata=metadata if isinstance(metadata, dict) else {},
        segments=record.segments,
        workers=record.workers,
        inferred=record.inferred,
    )
