"""Keep fast-only segments in DRAM: a wrapper over any host-tier eviction policy.

Placement decides that some segments never go to the SSD tier (reasoning, reviewers, the
predicted-shortest workers). For that to hold without losing them, DRAM must evict *other*
blocks first. :class:`PlacementGuard` wraps the DRAM policy (LRU, the Tenure gate, ...) and
passes the fast-only runs as protected to its ``select_victims``; only if the inner policy cannot
free enough (or, for a gate, refuses) with them protected does it ask again without them, so the
guard never turns an admissible store into a refusal. Every other hook goes straight through: the
wrapped policy keeps its own decisions and counters.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from tenure.service.policy.base import TierPolicy
from tenure.service.policy.tier_view import TierView
from tenure.service.policy.types import Run, SessionHint, Victim

__all__ = ["PlacementGuard"]


class PlacementGuard(TierPolicy):
    """``inner`` with the runs ``pinned()`` returns chosen as victims only as a last resort."""

    def __init__(self, inner: TierPolicy, pinned: Callable[[], Sequence[Run]]) -> None:
        super().__init__(None)
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]  # reports name the wrapped policy
        self.unbounded = inner.unbounded  # type: ignore[misc]
        self.no_capacity = inner.no_capacity  # type: ignore[misc]
        self.params = inner.params
        self.counters = inner.counters
        self._pinned = pinned

    def attach(self, tier: TierView) -> None:
        super().attach(tier)
        self.inner.attach(tier)

    def on_insert(self, run: Run, now: float) -> None:
        self.inner.on_insert(run, now)

    def on_request_insert(self, request: Hashable, run: Run, now: float) -> None:
        self.inner.on_request_insert(request, run, now)

    def on_request_access(self, request: Hashable, runs: Sequence[Run], now: float) -> None:
        self.inner.on_request_access(request, runs, now)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        self.inner.on_access(session, runs, inserted, now)

    def on_refused(self, session: str, runs: Sequence[Run], now: float) -> None:
        self.inner.on_refused(session, runs, now)

    def on_store_miss(self, runs: Sequence[Run], now: float) -> None:
        self.inner.on_store_miss(runs, now)

    def on_remove(self, run: Run) -> None:
        self.inner.on_remove(run)

    def on_hint(self, session: str, hint: SessionHint, now: float) -> None:
        self.inner.on_hint(session, hint, now)

    def forget(self, session: str) -> None:
        self.inner.forget(session)

    def on_request_start(self, session: str, now: float) -> None:
        self.inner.on_request_start(session, now)

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        pinned = self._pinned()
        if pinned:
            chosen = self.inner.select_victims(n, incoming, [*protected, *pinned], now)
            if chosen is not None:
                return chosen
            self.counters["guard_fallbacks"] += 1
        return self.inner.select_victims(n, incoming, protected, now)

    def due(self, now: float) -> list[Victim]:
        return self.inner.due(now)

    def next_timer(self) -> float | None:
        return self.inner.next_timer()

    def fingerprint(self) -> bytes:
        return self.inner.fingerprint()
