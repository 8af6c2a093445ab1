"""From the decision core's :class:`LifecycleDecision` to a push message and a record update.

The core decides; this module only translates its output into the wire message
(:class:`~tenure.service.wire.push.Decision`) and the session-record fields the APPLY script writes.
"""

from __future__ import annotations

from tenure.service.metrics import Metrics
from tenure.service.policy.lifecycle import LifecycleDecision
from tenure.service.state.keys import scoped_session_id
from tenure.service.state.records import SessionUpdate
from tenure.service.wire.push import Decision
from tenure.service.wire.session_record import RecordField

__all__ = ["as_message", "as_update", "count"]


def as_message(
    decision: LifecycleDecision, *, tenant: str, session: str, turn: int, parent: str | None,
    now: float,
) -> Decision:  # fmt: skip
    """The wire message; the scripts fill in ``seq`` (and on the hot path ``turn``)."""
    return Decision(
        seq=0,
        session_id=scoped_session_id(tenant, session),
        state=decision.state,
        turn=turn,
        expected_gap_s=decision.expected_gap_s,
        wakeup_at=decision.wakeup_at,
        last_turn=decision.last_turn,
        host_ttl_s=decision.host_ttl_s,
        parent=scoped_session_id(tenant, parent) if parent else None,
        reason=decision.reason,
        issued_at=now,
        host_rent_limit=decision.host_rent_limit,
        likely_end=decision.likely_end,
    )


def as_update(
    decision: LifecycleDecision,
    message: Decision,
    *,
    now: float,
    session_ttl_s: int,
    finished_ttl_s: int,
) -> SessionUpdate:
    """Record fields for the new state; finished sessions leave the live index and expire."""
    fields: dict[str, str] = {
        RecordField.STATE: decision.state,
        RecordField.LAST_ACTIVITY: repr(now),
        RecordField.REASON: decision.reason,
    }
    deleted: list[str] = []
    for name, value in (
        (RecordField.EXPECTED_GAP_S, decision.expected_gap_s),
        (RecordField.WAKEUP_AT, decision.wakeup_at),
        (RecordField.HOST_TTL_S, decision.host_ttl_s),
        (RecordField.HOST_RENT_LIMIT, decision.host_rent_limit),
    ):
        if value is None:
            deleted.append(name)
        else:
            fields[name] = repr(float(value))
    if decision.last_turn:
        fields[RecordField.LAST_TURN] = "1"
    finished = decision.state == "finished"
    if finished:
        live_score = None
    elif decision.likely_end:
        live_score = float("inf")  # no wake-up expected: last in wake-up order
    elif decision.wakeup_at is not None:
        live_score = decision.wakeup_at
    else:
        # No wake-up known (a suspension without an expected wait): last in wake-up order.
        live_score = float("inf") if decision.state == "suspended" else now
    return SessionUpdate(
        fields=fields,
        deleted=deleted,
        live_score=live_score,
        ttl_s=finished_ttl_s if finished else session_ttl_s,
        decision=message,
    )


def count(metrics: Metrics, decision: LifecycleDecision) -> None:
    metrics.count_decision(decision.state, decision.reason)
