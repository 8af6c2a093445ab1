"""Session-level lifecycle decisions: what the sidecar computes after each event of a session.

Pure functions from (event, hints, learned gaps, retention settings, now) to a
:class:`LifecycleDecision`: the session's state, its expected gap and wake-up, whether its state
is reclaimed at once (declared last turn), and for suspended sessions the host TTL. The sidecar
stores the decision in Redis and publishes it on the push channel; the engine adapter applies it
with the same core classes the replay measures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tenure.service.policy.gap import GapPredictor, stop_class
from tenure.service.policy.rent import RentClock, rent_budget
from tenure.service.policy.retention import (
    PriceVector,
    bound_by_declared_retention,
    host_ttl_seconds,
)
from tenure.service.policy.retention_costs import choose_regime
from tenure.service.policy.types import EvictionClass

__all__ = [
    "LIKELY_END",
    "STOP_BLIND",
    "LifecycleDecision",
    "RetentionSettings",
    "classify",
    "on_awaiting_child",
    "on_child_returned",
    "on_end",
    "on_likely_end",
    "on_request",
    "on_response",
    "on_resume",
    "on_spawn",
    "on_suspend",
]

State = Literal["active", "idle", "suspended", "finished"]
#: The reason prefix of an inferred end (``likely_end_one_shot``, ``likely_end_subagent``).
LIKELY_END = "likely_end"
#: The reason of an idle decision whose gap was predicted without a stop reason (the tenant's
#: stop-blind median): an engine whose policy learns gaps per session
#: (``TierPolicy.learns_gaps``) uses its own learned gap instead.
STOP_BLIND = "predicted_other"


@dataclass(frozen=True, slots=True)
class LifecycleDecision:
    state: State
    expected_gap_s: float | None
    wakeup_at: float | None
    last_turn: bool
    reclaim: bool
    host_ttl_s: float | None
    reason: str
    #: A suspension on the ttl branch: its host copy expires when the tenant's rent clock
    #: reaches this (GPU-s, :mod:`tenure.service.policy.rent`); ``host_ttl_s`` is then the same
    #: timer at the price of the moment (``None`` while uncongested).
    host_rent_limit: float | None = None
    #: The run probably ended with this turn (:func:`on_likely_end`).
    likely_end: bool = False


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """What the host-TTL decision needs: price vector, host slots C2, W_ref, lambda mode."""

    price: PriceVector
    host_slots: float
    w_ref_s: float
    #: ``None``: use the online estimate; a number: the SRE fixed lambda (suspensions/s).
    fixed_lambda: float | None = None


def on_request(now: float, *, last_turn: bool, hinted_gap_s: float | None) -> LifecycleDecision:
    """A turn starts: the session is active; a hint may already say what follows it."""
    return LifecycleDecision(
        state="active",
        expected_gap_s=hinted_gap_s,
        wakeup_at=None,
        last_turn=last_turn,
        reclaim=False,
        host_ttl_s=None,
        reason="last_turn_declared" if last_turn else "request",
    )


def on_response(
    now: float,
    *,
    stop_reason: str | None,
    last_turn: bool,
    hinted_gap_s: float | None,
    predictor: GapPredictor,
    tool: str | None = None,
) -> LifecycleDecision:
    """A turn ended: finished (reclaim at once) on a declared last turn, else idle until the
    hinted or predicted wake-up."""
    if last_turn:
        return LifecycleDecision("finished", None, None, True, True, None, "last_turn")
    if hinted_gap_s is not None:
        gap, reason = hinted_gap_s, "hinted_gap"
    else:
        gap, reason = predictor.predict(stop_reason, tool), f"predicted_{stop_class(stop_reason)}"
    return LifecycleDecision("idle", gap, now + gap, False, False, None, reason)


def on_suspend(
    now: float,
    *,
    expected_wait_s: float | None,
    retention: RetentionSettings,
    estimated_lambda: float,
    calibration_waits_s: Sequence[float] = (),
    branch: Literal["retain", "ttl"] | None = None,
    declared_retention_s: float | None = None,
    rent: RentClock | None = None,
    timer_scale: float | None = 1.0,
) -> LifecycleDecision:
    """A human-approval wait begins: keep the host copy for ``t2(lambda)`` (or indefinitely).

    ``branch`` is the online controller's current choice
    (:class:`~tenure.service.policy.retention_control.OnlineController`, re-chosen periodically by
    the sidecar): ``ttl`` gives ``t2(lambda)`` (none while uncongested), ``retain`` none.
    Without it, calibration waits are scored here (the regime choice per suspension);
    without those either, the TTL branch applies whenever the host tier is congested.
    ``declared_retention_s``, the session's own client-declared retention (its last turn's
    ``cache_control`` TTL), caps the hold while the tier is congested
    (:func:`~tenure.service.policy.retention.bound_by_declared_retention`; reason
    ``client_retention`` when it is what binds).

    ``rent``, the tenant's rent clock (with ``branch``), re-prices the timer while the copy
    is held: on the ttl branch the decision carries ``host_rent_limit = R(now) + beta3 -
    beta2``, so the copy expires when the rent actually charged reaches the break-even (at a
    constant price exactly ``now + t2``). A binding declared retention stays a fixed timer.

    ``timer_scale`` (with ``branch``): the retention rule's rent-budget scale
    (:mod:`tenure.service.policy.retention_rule`): the ttl branch's timer is ``scale x t2`` and its
    rent limit ``R(now) + scale x (beta3 - beta2)``; 1 is the seed's ``t2``.
    """
    lam = retention.fixed_lambda if retention.fixed_lambda is not None else estimated_lambda
    if branch is not None:
        # The reasons the other paths give: regime_retain (the controller chose retain),
        # host_ttl / host_retain (the ttl branch, congested or not).
        if branch == "retain":
            ttl, reason = None, "regime_retain"
        else:
            ttl = host_ttl_seconds(lam, retention.price, retention.host_slots, retention.w_ref_s)
            scale = 1.0 if timer_scale is None else timer_scale
            ttl = None if ttl is None else scale * ttl
            reason = "host_retain" if ttl is None else "host_ttl"
    elif calibration_waits_s:
        choice = choose_regime(
            calibration_waits_s, lam, retention.price, retention.host_slots, retention.w_ref_s
        )
        ttl, reason = choice.host_ttl_s, f"regime_{choice.regime}"
    else:
        ttl = host_ttl_seconds(lam, retention.price, retention.host_slots, retention.w_ref_s)
        reason = "host_retain" if ttl is None else "host_ttl"
    bounded = bound_by_declared_retention(
        ttl, declared_retention_s, lam, retention.host_slots, retention.w_ref_s
    )
    limit: float | None = None
    if bounded != ttl:
        ttl, reason = bounded, "client_retention"
    elif branch == "ttl" and rent is not None:
        scale = 1.0 if timer_scale is None else timer_scale
        limit = rent.limit_for(now, scale * rent_budget(retention.price))
    wakeup = None if expected_wait_s is None else now + expected_wait_s
    return LifecycleDecision(
        "suspended", expected_wait_s, wakeup, False, False, ttl, reason, host_rent_limit=limit
    )


def on_resume(now: float) -> LifecycleDecision:
    return LifecycleDecision("idle", 0.0, now, False, False, None, "resumed")


def on_spawn(now: float, *, role: str) -> LifecycleDecision:
    """A sub-agent was spawned: it is about to send its first request (wake-up now)."""
    return LifecycleDecision("idle", 0.0, now, False, False, None, f"spawned_{role}")


def on_likely_end(now: float, *, reason: str) -> LifecycleDecision:
    """A turn ended and the run probably with it (a one-shot entry point's final answer, a
    sub-agent's answer): idle without a wake-up, its blocks evicted first among the live but
    not reclaimed, so a resumed run (``--continue``) still hits what is resident."""
    return LifecycleDecision("idle", None, None, False, False, None, reason, likely_end=True)


def on_awaiting_child(now: float, *, child_lifetime_s: float) -> LifecycleDecision:
    """A lead waits for a foreground sub-agent: its gap is the child's predicted lifetime
    (a worker's, not a human's)."""
    gap = max(0.0, child_lifetime_s)
    return LifecycleDecision("idle", gap, now + gap, False, False, None, "awaiting_child")


def on_child_returned(now: float) -> LifecycleDecision:
    """A lead's sub-agent answered: the lead goes on at once (wake-up now)."""
    return LifecycleDecision("idle", 0.0, now, False, False, None, "child_returned")


def on_end(now: float) -> LifecycleDecision:
    return LifecycleDecision("finished", None, None, True, True, None, "ended")


def classify(
    state: State, wakeup_at: float | None, now: float, slack_s: float, *, likely_end: bool = False
) -> EvictionClass | None:
    """The eviction class a session would fall in now (``None``: live, not evictable yet)."""
    if state == "finished" or (likely_end and state == "idle"):
        return EvictionClass.FINISHED
    if state == "active" or wakeup_at is None or not math.isfinite(wakeup_at):
        return None
    if now > wakeup_at + slack_s:
        return EvictionClass.OVERDUE
    return EvictionClass.FAR_WAKEUP
