"""The clairvoyant reference at the same capacity (Belady at session granularity).

It is fed the true next gap of every session and whether it has a next turn (hint source
``exact``), and evicts the resident whose next use is farthest in the future (sessions with no
next use first), refusing the incoming store when its own next use is the farthest. Unlike the
gate it has no notion of overdue: its predictions are never wrong. It bounds what an online
policy that decides per session can reach on the same tier; it is not optimal for
variable-size objects (no online or offline policy here claims that).
"""

from __future__ import annotations

import math

from tenure.service.policy.sessions import SessionPolicy
from tenure.service.policy.types import EvictionClass

__all__ = ["OraclePolicy"]


class OraclePolicy(SessionPolicy):
    name = "oracle"
    admission = True
    hint_source = "exact"
    reclaims = True

    def _next_use(self, session: str, now: float) -> float:
        life = self.peek(session)
        if life.finished or (life.declared_last and not life.active):
            return math.inf
        if life.active:
            return now
        return life.wakeup if life.wakeup is not None else math.inf

    def victim_order(
        self, n: int, incoming: str | None, candidates: dict[str, int], now: float
    ) -> list[tuple[str, EvictionClass]] | None:
        if incoming is not None:
            life = self.peek(incoming)
            if life.refused:
                return None
            gap = life.expected_gap_s
            incoming_use = math.inf if life.declared_last or gap is None else now + gap
        else:
            incoming_use = math.inf
        ranked = sorted(((self._next_use(s, now), s) for s in candidates), reverse=True)
        order: list[tuple[str, EvictionClass]] = []
        have = 0
        for next_use, session in ranked:
            if next_use <= incoming_use and next_use != math.inf:
                break
            cls = EvictionClass.FINISHED if next_use == math.inf else EvictionClass.ORACLE
            order.append((session, cls))
            have += candidates[session]
            if have >= n:
                return order
        return None
