"""MORI-style idleness rank: evict the sessions that have been idle longest.

Sessions are ranked by how long they have been idle (no request in flight); the most idle goes
first, whole-session and tail-first. Sessions idle for less than ``min_idle_s`` are taken only
after every longer-idle one. Eviction-only: it never refuses while anything is evictable.
"""

from __future__ import annotations

from tenure.service.policy.sessions import SessionPolicy
from tenure.service.policy.types import EvictionClass

__all__ = ["MoriPolicy"]


class MoriPolicy(SessionPolicy):
    name = "mori"
    defaults = {"min_idle_s": 0.0}
    sweep = {"min_idle_s": (0.0, 5.0, 15.0)}

    def victim_order(
        self, n: int, incoming: str | None, candidates: dict[str, int], now: float
    ) -> list[tuple[str, EvictionClass]] | None:
        idle = [
            (now - self.peek(s).last_activity, s) for s in candidates if not self.peek(s).active
        ]
        idle.sort(reverse=True)
        threshold = self.params["min_idle_s"]
        order = [(s, EvictionClass.IDLE) for t, s in idle if t >= threshold]
        order += [(s, EvictionClass.IDLE) for t, s in idle if t < threshold]
        if sum(candidates[s] for s, _ in order) < n:
            return None
        return order
