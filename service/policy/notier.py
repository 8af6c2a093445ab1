"""The two references that bound every policy: no host tier at all, and an unbounded one."""

from __future__ import annotations

from collections.abc import Sequence

from tenure.service.policy.base import TierPolicy
from tenure.service.policy.types import Run, Victim

__all__ = ["InfinitePolicy", "NoTierPolicy"]


class NoTierPolicy(TierPolicy):
    """No host tier: every store is refused, so every lost prefix is recomputed.

    The tier it governs has no room whatever capacity it was given.
    """

    admission = True

    name = "notier"
    no_capacity = True

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        return None


class InfinitePolicy(TierPolicy):
    """Unbounded host tier: the residency upper bound (nothing is ever evicted)."""

    name = "infinite"
    unbounded = True

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        raise AssertionError("an unbounded tier never needs to evict")
