"""The Redis session record: one hash per session, its field names, and its typed reading.

The Lua scripts (:mod:`tenure.service.state.scripts`) and the sidecar write the hash's fields as
strings; :class:`RecordField` names every one of them once, and :class:`SessionRecord` is what the
sidecar reads back: typed values parsed leniently (a malformed or foreign value reads as
unknown, never as an error: a record written by an older build stays readable), plus the hash
itself, so an update can be previewed (:meth:`SessionRecord.updated`) exactly as the APPLY
script will store it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from enum import StrEnum

import msgspec

__all__ = ["RecordField", "SessionRecord"]


class RecordField(StrEnum):
    """Every field of a session hash (the Lua scripts spell the same names)."""

    ID = "id"
    STATE = "state"
    TURN = "turn"
    VERSION = "version"
    CREATED_AT = "created_at"
    LAST_ACTIVITY = "last_activity"
    EXPECTED_GAP_S = "expected_gap_s"
    WAKEUP_AT = "wakeup_at"
    STOP_REASON = "stop_reason"
    TOOL = "tool"
    LAST_TURN = "last_turn"
    LAST_END = "last_end"
    REASON = "reason"
    SUSPENDED_AT = "suspended_at"
    SUSPEND_REASON = "suspend_reason"
    EXPECTED_WAIT_S = "expected_wait_s"
    HOST_TTL_S = "host_ttl_s"
    #: The re-priced timer's limit on the tenant's rent clock (ttl-branch suspensions).
    HOST_RENT_LIMIT = "host_rent_limit"
    #: The client-declared retention of the session's last turn (a ``cache_control`` TTL).
    RETENTION_S = "retention_s"
    PARENT = "parent"
    ROLE = "role"
    METADATA = "metadata"
    SEGMENTS = "segments"
    WORKERS = "workers"
    INFERRED = "inferred"
    UNDO = "undo"
    #: The newest prefix keys of an inferred session (the ``TURN_START`` script's own).
    PREFIX_KEYS = "px"


def _float(value: str | None) -> float | None:
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _int(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        return 0


def _json_list(value: str | None) -> list[str]:
    try:
        parsed = json.loads(value or "[]")
    except ValueError:
        return []
    return [str(v) for v in parsed] if isinstance(parsed, list) else []


class SessionRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One session's record as read from Redis (``fields``: the hash as stored)."""

    fields: dict[str, str]
    id: str = ""
    #: ``None`` when the hash has no state (never written by the scripts; a foreign writer).
    state: str | None = None
    turn: int = 0
    version: str = ""
    created_at: float | None = None
    last_activity: float | None = None
    expected_gap_s: float | None = None
    wakeup_at: float | None = None
    stop_reason: str | None = None
    tool: str | None = None
    last_turn: bool = False
    reason: str | None = None
    suspended_at: float | None = None
    suspend_reason: str | None = None
    expected_wait_s: float | None = None
    host_ttl_s: float | None = None
    host_rent_limit: float | None = None
    retention_s: float | None = None
    parent: str | None = None
    role: str | None = None
    #: The client's metadata as stored (JSON text; parsed by whoever shows it).
    metadata: str = ""
    segments: list[str] = msgspec.field(default_factory=list)
    workers: list[str] = msgspec.field(default_factory=list)
    inferred: bool = False

    @classmethod
    def from_hash(cls, raw: Mapping[str, str]) -> SessionRecord:
        get = raw.get
        return cls(
            fields=dict(raw),
            id=get(RecordField.ID, ""),
            state=get(RecordField.STATE),
            turn=_int(get(RecordField.TURN)),
            version=get(RecordField.VERSION, ""),
            created_at=_float(get(RecordField.CREATED_AT)),
            last_activity=_float(get(RecordField.LAST_ACTIVITY)),
            expected_gap_s=_float(get(RecordField.EXPECTED_GAP_S)),
            wakeup_at=_float(get(RecordField.WAKEUP_AT)),
            stop_reason=get(RecordField.STOP_REASON) or None,
            tool=get(RecordField.TOOL) or None,
            last_turn=get(RecordField.LAST_TURN) == "1",
            reason=get(RecordField.REASON) or None,
            suspended_at=_float(get(RecordField.SUSPENDED_AT)),
            suspend_reason=get(RecordField.SUSPEND_REASON) or None,
            expected_wait_s=_float(get(RecordField.EXPECTED_WAIT_S)),
            host_ttl_s=_float(get(RecordField.HOST_TTL_S)),
            host_rent_limit=_float(get(RecordField.HOST_RENT_LIMIT)),
            retention_s=_float(get(RecordField.RETENTION_S)),
            parent=get(RecordField.PARENT) or None,
            role=get(RecordField.ROLE) or None,
            metadata=get(RecordField.METADATA) or "",
            segments=_json_list(get(RecordField.SEGMENTS)),
            workers=_json_list(get(RecordField.WORKERS)),
            inferred=get(RecordField.INFERRED) == "1",
        )

    def updated(self, fields: Mapping[str, str], deleted: Iterable[str] = ()) -> SessionRecord:
        """The record as it reads after an update writes ``fields`` and deletes ``deleted``."""
        merged = {**self.fields, **fields}
        for name in deleted:
            merged.pop(name, None)
        return SessionRecord.from_hash(merged)
