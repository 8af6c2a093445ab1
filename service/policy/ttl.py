"""Continuum-style TTL pinning: keep a session's blocks pinned for a time-to-live after a turn.

After each turn the session's blocks are pinned for ``ttl_factor`` times its expected gap (the
same hints Tenure gets). Eviction is eviction-only: unpinned sessions go first in recency order
(least recently active first); when only pinned ones remain, pins are force-evicted, earliest
expiry first. A store is refused only when nothing else is resident.
"""

from __future__ import annotations

from tenure.service.policy.sessions import SessionPolicy
from tenure.service.policy.types import EvictionClass

__all__ = ["TTLPinPolicy"]


class TTLPinPolicy(SessionPolicy):
    name = "ttl"
    hint_source = "predicted"
    defaults = {"ttl_factor": 1.0, "default_ttl_s": 30.0}
    sweep = {"ttl_factor": (0.5, 1.0, 2.0)}

    def victim_order(
        self, n: int, incoming: str | None, candidates: dict[str, int], now: float
    ) -> list[tuple[str, EvictionClass]] | None:
        unpinned: list[tuple[float, str]] = []
        pinned: list[tuple[float, str]] = []
        for session in candidates:
            life = self.peek(session)
            if life.active:
                continue
            gap = life.expected_gap_s
            factor, default = self.params["ttl_factor"], self.params["default_ttl_s"]
            ttl = default if gap is None else factor * gap
            expiry = life.last_activity + ttl
            if life.finished or expiry <= now:
                unpinned.append((life.last_activity, session))
            else:
                pinned.append((expiry, session))
        order = [(s, EvictionClass.RECENCY) for _, s in sorted(unpinned)]
        order += [(s, EvictionClass.TTL) for _, s in sorted(pinned)]
        if sum(candidates[s] for s, _ in order) < n:
            return None
        return order
