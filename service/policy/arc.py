"""ARC exactly as vLLM's ``ARCCachePolicy`` runs it, over the core's run API.

ARC's state (T1/T2 recency lists, B1/B2 ghost lists and the adaptive T1 target) is per block by
nature, so this policy keeps one entry per block, keyed by ``seg << 32 | index``; it is the one
baseline whose cost grows with blocks, and the ladder says so. Semantics follow vLLM 0.32: a
store inserts into T1 (dropping ghosts); a store miss that hits a ghost adapts the target once; a
request-scoped access promotes reused blocks T1 -> T2 (or refreshes them in T2) tail to head,
while blocks the request only inserted keep their list and move to its MRU end; eviction takes
from T1 while it is at or above the target, else from T2, recording ghosts, then trims ghosts.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence

from tenure.service.policy.base import TierPolicy, merge_runs
from tenure.service.policy.types import EvictionClass, Run, Victim

__all__ = ["ARCPolicy"]

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1


def _keys(run: Run) -> range:
    base = run.seg << _SHIFT
    return range(base + run.start, base + run.stop)


class ARCPolicy(TierPolicy):
    name = "arc"

    def __init__(self, params: dict[str, float] | None = None) -> None:
        super().__init__(params)
        self.target_t1_size = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    @property
    def _capacity(self) -> int:
        capacity = self.tier.capacity
        return capacity if capacity is not None else 1 << 62

    def on_insert(self, run: Run, now: float) -> None:
        t1, b1, b2 = self.t1, self.b1, self.b2
        for key in _keys(run):
            t1[key] = None
            b1.pop(key, None)
            b2.pop(key, None)

    def on_remove(self, run: Run) -> None:
        for key in _keys(run):
            if key in self.t1:
                del self.t1[key]
            else:
                self.t2.pop(key, None)

    def _adapt_to_ghost_hit(self, key: int) -> None:
        if key in self.b1:
            delta = max(1.0, len(self.b2) / len(self.b1))
            self.target_t1_size = min(self.target_t1_size + delta, self._capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:
            delta = max(1.0, len(self.b1) / len(self.b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0.0)
            self.b2.move_to_end(key)

    def on_store_miss(self, runs: Sequence[Run], now: float) -> None:
        if not self.b1 and not self.b2:
            return
        for run in reversed(runs):
            for key in reversed(_keys(run)):
                self._adapt_to_ghost_hit(key)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        inserted_keys: set[int] = set()
        for run in inserted:
            inserted_keys.update(_keys(run))
        t1, t2 = self.t1, self.t2
        for run in reversed(runs):
            for key in reversed(_keys(run)):
                if key in inserted_keys:
                    if key in t1:
                        t1.move_to_end(key)
                    elif key in t2:
                        t2.move_to_end(key)
                elif key in t1:
                    del t1[key]
                    t2[key] = None
                elif key in t2:
                    t2.move_to_end(key)

    def on_touch(self, runs: Sequence[Run], pending: Sequence[Run], now: float) -> None:
        # vLLM's ARC touch, tail to head: a ready T1 block is promoted to T2, a pending one
        # (its store not complete) only moves to T1's MRU end; T2 blocks move to its MRU end;
        # a block in neither adapts the target if it is a ghost.
        waiting: set[int] = set()
        for run in pending:
            waiting.update(_keys(run))
        t1, t2 = self.t1, self.t2
        for run in reversed(runs):
            for key in reversed(_keys(run)):
                if key in t1:
                    if key in waiting:
                        t1.move_to_end(key)
                    else:
                        del t1[key]
                        t2[key] = None
                elif key in t2:
                    t2.move_to_end(key)
                else:
                    self._adapt_to_ghost_hit(key)

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        if n == 0:
            return []
        guard: set[int] = set()
        for run in protected:
            guard.update(_keys(run))

        def candidates(entries: Iterator[int]) -> Iterator[int]:
            return (key for key in entries if key not in guard)

        t1_iter = candidates(iter(self.t1))
        t2_iter = candidates(iter(self.t2))
        virtual_t1 = len(self.t1)
        chosen: list[tuple[int, bool]] = []
        for _ in range(n):
            key: int | None = None
            from_t1 = False
            if virtual_t1 >= int(self.target_t1_size):
                key = next(t1_iter, None)
                if key is not None:
                    from_t1 = True
                    virtual_t1 -= 1
            if key is None:
                key = next(t2_iter, None)
            if key is None:
                key = next(t1_iter, None)
                if key is None:
                    return None
                from_t1 = True
                virtual_t1 -= 1
            chosen.append((key, from_t1))
        for key, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        capacity = self._capacity
        for ghost in (self.b1, self.b2):
            for _ in range(len(ghost) - capacity):
                ghost.popitem(last=False)
        victims = merge_runs([(k >> _SHIFT, k & _MASK) for k, _ in chosen], EvictionClass.RECENCY)
        self._count_victims(victims)
        return victims
