"""Re-priced host timers at the adapter: each tenant's rent clock and its held copies' limits.

The sidecar gives a suspension on the ttl branch a limit on its tenant's rent clock
(:class:`~tenure.service.policy.rent.RentClock`, the congestion rent one host slot has accrued) and
pushes the clock in every snapshot (:class:`~tenure.service.wire.push.RetentionState`). The copy
expires when the clock reaches the limit, so its timer is ``clock.remaining(limit, now)``: a
higher rate (more congestion) brings the expiry closer, a lower one moves it away, zero keeps
the copy until resume unless the price rises. This module keeps the clocks (as of the
snapshot that brought them) and the held copies (bounded); :mod:`tenure.engine_adapter.pushed`
applies the timers to the core. Engine thread only. Pure arithmetic comes from the core.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass

from tenure.service.policy.rent import RentClock
from tenure.service.wire.push import Decision, RetentionState

__all__ = ["Held", "RentTimers", "moved", "tenant_of", "valid_limit"]

#: Held copies remembered (the oldest are forgotten past this: they keep the timer they had).
_MAX_HELD = 20_000
#: Tenants whose clocks are kept (snapshots name configured tenants only; this bounds a bad one).
_MAX_TENANTS = 1024


def tenant_of(session: str) -> str:
    """The tenant part of a scoped session id (``tenant/session``), as the sidecar sends it."""
    return session.split("/", 1)[0] if "/" in session else ""


def moved(before: float | None, after: float | None, now: float) -> bool:
    """Whether a deadline moved enough to re-hint: by more than max(1 s, 1% of what was left),
    or between a deadline and none."""
    if before is None or after is None:
        return (before is None) != (after is None)
    return abs(after - before) > max(1.0, 0.01 * max(0.0, before - now))


@dataclass(slots=True)
class Held:
    """A suspended session's host copy with a re-priced timer."""

    tenant: str
    limit: float
    decision: Decision
    #: The deadline the core was last given (the policy's monotonic clock; ``None``: none).
    deadline: float | None


class RentTimers:
    def __init__(self) -> None:
        #: Tenant -> (its clock, Unix time of the snapshot that brought it).
        self.clocks: dict[str, tuple[RentClock, float]] = {}
        self.held: OrderedDict[str, Held] = OrderedDict()

    def update(self, retention: Mapping[str, RetentionState], as_of: float) -> int:
        """Take the tenants' clocks from a snapshot; returns how many were refused (negative
        or non-finite fields: that tenant keeps the clock it had)."""
        refused = 0
        for tenant, state in retention.items():
            try:
                clock = RentClock(state.rent_accrued, state.rent_at, state.rent_rate)
            except (TypeError, ValueError):
                refused += 1
                continue
            if clock.at is None:
                self.clocks.pop(tenant, None)  # a sidecar without a clock: decisions' timers
            elif tenant in self.clocks or len(self.clocks) < _MAX_TENANTS:
                self.clocks[tenant] = (clock, as_of)
        return refused

    def remaining(
        self, tenant: str, limit: float, wall: float, *, newer_than: float = -math.inf
    ) -> tuple[bool, float | None]:
        """``(known, seconds)``: the timer of a copy with ``limit`` from ``wall`` on, from
        ``tenant``'s clock (``None`` seconds: held until the price rises). ``known`` is false
        without a clock, or with one brought by a snapshot older than ``newer_than``."""
        entry = self.clocks.get(tenant)
        if entry is None or entry[1] < newer_than:
            return False, None
        return True, entry[0].remaining(limit, wall)

    def hold(self, session: str, held: Held) -> None:
        self.held[session] = held
        self.held.move_to_end(session)
        while len(self.held) > _MAX_HELD:
            self.held.popitem(last=False)

    def release(self, session: str) -> None:
        self.held.pop(session, None)


def valid_limit(limit: float | None) -> bool:
    return limit is not None and math.isfinite(limit) and limit >= 0
