"""LRU exactly as vLLM's ``LRUCachePolicy`` orders blocks, kept as runs instead of keys.

vLLM gives every resident block a rank from one counter: a store ranks the new blocks head to
tail (so the head is older), a request-scoped access re-ranks the blocks it used tail to head
(so the head is the most recent), and eviction takes the lowest ranks first, skipping the keys
of the store being made. Each of those operations hands out one contiguous range of ranks over a
contiguous range of a segment's blocks, so the state compresses into *rank runs*: ``(segment,
block range, lowest rank, direction)``. Rank runs never interleave in rank order, which lets
eviction walk them with a heap and take blocks from each run's low end. The cost is per run,
not per block, and the eviction order is block-for-block identical to vLLM's (the differential
test in ``tests/policy`` drives both with the same calls).
"""

from __future__ import annotations

import heapq
import itertools
import pickle
from bisect import bisect_left
from collections.abc import Sequence

from service.policy.base import TierPolicy
from service.policy.types import EvictionClass, Run, SessionHint, Victim

__all__ = ["LRUPolicy", "LRUReclaimPolicy"]


# Containers whose layout varies for one state (the lazily cleaned heap); see fingerprint().
_LRU_INTERNALS = frozenset({"_heap", "_by_seg", "_uid", "_next_rank", "_tier"})


class _RankRun:
    """Blocks ``[lo, hi)`` of ``seg`` hold ranks ``base .. base + hi - lo - 1``.

    ``asc``: rank grows with block index (a store); otherwise it falls (an access).
    """

    __slots__ = ("alive", "asc", "base", "hi", "lo", "seg")

    def __init__(self, seg: int, lo: int, hi: int, base: int, asc: bool) -> None:
        self.seg = seg
        self.lo = lo
        self.hi = hi
        self.base = base
        self.asc = asc
        self.alive = True

    def rank(self, index: int) -> int:
        return self.base + (index - self.lo if self.asc else self.hi - 1 - index)

    def part(self, lo: int, hi: int) -> _RankRun:
        """The sub-run over ``[lo, hi)`` with the same ranks."""
        base = self.rank(lo) if self.asc else self.rank(hi - 1)
        return _RankRun(self.seg, lo, hi, base, self.asc)


class LRUPolicy(TierPolicy):
    """vLLM's LRU: stores and request-scoped accesses are uses; evict the least recent."""

    name = "lru"

    def __init__(self, params: dict[str, float] | None = None) -> None:
        super().__init__(params)
        self._next_rank = 0
        self._by_seg: dict[int, list[_RankRun]] = {}
        self._heap: list[tuple[int, int, _RankRun]] = []
        self._uid = itertools.count()

    # --- rank-run bookkeeping ---------------------------------------------------------------

    def _add(self, run: _RankRun) -> None:
        runs = self._by_seg.setdefault(run.seg, [])
        runs.insert(bisect_left([r.lo for r in runs], run.lo), run)
        heapq.heappush(self._heap, (run.base, next(self._uid), run))

    def _cut(self, seg: int, lo: int, hi: int) -> None:
        """Forget the ranks of blocks ``[lo, hi)`` of ``seg`` (they get new ones or leave)."""
        runs = self._by_seg.get(seg)
        if not runs:
            return
        keep: list[_RankRun] = []
        pieces: list[_RankRun] = []
        for run in runs:
            if run.hi <= lo or run.lo >= hi:
                keep.append(run)
                continue
            run.alive = False
            if run.lo < lo:
                pieces.append(run.part(run.lo, lo))
            if run.hi > hi:
                pieces.append(run.part(hi, run.hi))
        if not pieces and len(keep) == len(runs):
            return
        keep.extend(pieces)
        keep.sort(key=lambda r: r.lo)
        if keep:
            self._by_seg[seg] = keep
        else:
            del self._by_seg[seg]
        for piece in pieces:
            heapq.heappush(self._heap, (piece.base, next(self._uid), piece))

    def _rank_range(self, seg: int, lo: int, hi: int, asc: bool) -> None:
        self._cut(seg, lo, hi)
        run = _RankRun(seg, lo, hi, self._next_rank + 1, asc)
        self._next_rank += hi - lo
        self._add(run)

    # --- hooks ------------------------------------------------------------------------------

    def on_insert(self, run: Run, now: float) -> None:
        self._rank_range(run.seg, run.start, run.stop, asc=True)

    def _rerank(self, runs: Sequence[Run]) -> None:
        # vLLM re-ranks the used resident keys tail to head: the head ends most recent.
        for run in reversed(runs):
            for piece in reversed(self.tier.resident([run])):
                self._rank_range(piece.seg, piece.start, piece.stop, asc=False)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        self._rerank(runs)

    def on_touch(self, runs: Sequence[Run], pending: Sequence[Run], now: float) -> None:
        # vLLM's touch re-ranks the given keys exactly as a request-scoped access does.
        self._rerank(runs)

    def on_remove(self, run: Run) -> None:
        self._cut(run.seg, run.start, run.stop)

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        if n == 0:
            return []
        guard: dict[int, list[tuple[int, int]]] = {}
        for p in protected:
            guard.setdefault(p.seg, []).append((p.start, p.stop))
        chosen: list[Victim] = []  # in eviction (rank) order
        need = n
        popped: list[tuple[int, int, _RankRun]] = []
        heap = self._heap
        while heap and need > 0:
            entry = heapq.heappop(heap)
            run = entry[2]
            if not run.alive or entry[0] != run.base:
                continue
            popped.append(entry)
            for lo, hi in _unprotected(run.lo, run.hi, guard.get(run.seg), run.asc):
                take = min(need, hi - lo)
                # Ranks rise from lo (a store) or from hi - 1 (an access): take the low end.
                if run.asc:
                    chosen.append(Victim(Run(run.seg, lo, lo + take), EvictionClass.RECENCY))
                else:
                    chosen.append(Victim(Run(run.seg, hi - take, hi), EvictionClass.RECENCY, True))
                need -= take
                if need == 0:
                    break
        for entry in popped:
            heapq.heappush(heap, entry)
        if need > 0:
            return None
        victims = chosen
        for victim in victims:
            self._cut(victim.run.seg, victim.run.start, victim.run.stop)
        self._compact()
        self._count_victims(victims)
        return victims

    def fingerprint(self) -> bytes:
        runs = sorted(
            (r.seg, r.lo, r.hi, r.base, r.asc) for rs in self._by_seg.values() for r in rs
        )
        extra = {k: v for k, v in vars(self).items() if k not in _LRU_INTERNALS}
        return pickle.dumps((self._next_rank, runs, extra))

    def _compact(self) -> None:
        live = sum(len(runs) for runs in self._by_seg.values())
        if len(self._heap) > max(64, 4 * live):
            self._heap = [(r.base, next(self._uid), r) for rs in self._by_seg.values() for r in rs]
            heapq.heapify(self._heap)


def _unprotected(
    lo: int, hi: int, spans: list[tuple[int, int]] | None, asc: bool
) -> list[tuple[int, int]]:
    """Sub-ranges of ``[lo, hi)`` outside the protected spans, in rank order."""
    if not spans:
        return [(lo, hi)]
    free = [(lo, hi)]
    for a, b in spans:
        nxt: list[tuple[int, int]] = []
        for x, y in free:
            if b <= x or a >= y:
                nxt.append((x, y))
                continue
            if x < a:
                nxt.append((x, a))
            if b < y:
                nxt.append((b, y))
        free = nxt
    free.sort()
    return free if asc else free[::-1]


class LRUReclaimPolicy(LRUPolicy):
    """LRU plus one signal: a declared last turn frees the session's blocks at once.

    The seed's "last_turn signal alone" ablation (no gate): it isolates what reclaim buys.
    """

    name = "lru-reclaim"
    hint_source = "predicted"

    def __init__(self, params: dict[str, float] | None = None) -> None:
        super().__init__(params)
        self._active: set[str] = set()
        self._declared_last: set[str] = set()
        self._reclaim: list[str] = []

    def on_request_start(self, session: str, now: float) -> None:
        self._active.add(session)
        # A new request after a declared last turn means the declaration was wrong: keep it.
        self._declared_last.discard(session)

    def on_hint(self, session: str, hint: SessionHint, now: float) -> None:
        if not hint.last_turn:
            self._declared_last.discard(session)
        elif session in self._active:
            self._declared_last.add(session)  # reclaim when the last turn's request finishes
        else:
            self._reclaim.append(session)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        super().on_access(session, runs, inserted, now)
        self._active.discard(session)
        if session in self._declared_last:
            self._declared_last.discard(session)
            self._reclaim.append(session)

    def due(self, now: float) -> list[Victim]:
        victims: list[Victim] = []
        tier = self.tier
        for session in self._reclaim:
            for seg in tier.segments_of(session):
                for run in tier.tail_runs(seg, tier.resident_blocks(seg)):
                    self._cut(run.seg, run.start, run.stop)
                    victims.append(Victim(run, EvictionClass.RECLAIM))
        self._reclaim.clear()
        self._count_victims(victims)
        return victims

    def next_timer(self) -> float | None:
        return float("-inf") if self._reclaim else None
