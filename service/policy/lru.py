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

``request_ranks=1`` is vLLM 0.33's LRU: a request holds one rank, taken at its first access,
and the blocks it stores or uses mid-flight rank ``(request rank, -position)`` inside it, so
its tail goes before its head; finishing the request (or a touch) re-ranks as before. Those
are *request* rank runs. Runs of one request in different segments (a second KV group's fork)
may interleave in rank order; eviction merges them, ties going to the older segment (vLLM
breaks them by key, i.e. by KV group, and the adapter forks KV groups in group order).
"""

from __future__ import annotations

import heapq
import itertools
import pickle
from bisect import bisect_left
from collections.abc import Hashable, Sequence

from tenure.service.policy.base import TierPolicy
from tenure.service.policy.types import EvictionClass, Run, SessionHint, Victim

__all__ = ["LRUPolicy", "LRUReclaimPolicy"]


# Containers whose layout varies for one state (the lazily cleaned heap); see fingerprint().
_LRU_INTERNALS = frozenset({"_heap", "_by_seg", "_uid", "_next_rank", "_tier"})
#: Requests whose rank is remembered (vLLM keeps it in the request's context while it lives).
_REQUEST_RANKS_KEPT = 1 << 16

#: A block's place in eviction order: ``(major, minor, segment)``, lowest evicted first.
RankKey = tuple[int, int, int]


class _RankRun:
    """Blocks ``[lo, hi)`` of ``seg`` hold ranks ``base .. base + hi - lo - 1`` (minor 0).

    ``asc``: rank grows with block index (a store); otherwise it falls (an access).
    ``request``: every block holds major ``base`` and minor ``-index`` (vLLM 0.33's request
    rank, tail first); such a run is never ``asc``.
    """

    __slots__ = ("alive", "asc", "base", "hi", "lo", "request", "seg")

    def __init__(
        self, seg: int, lo: int, hi: int, base: int, asc: bool, request: bool = False
    ) -> None:
        self.seg = seg
        self.lo = lo
        self.hi = hi
        self.base = base
        self.asc = asc
        self.request = request
        self.alive = True

    def rank(self, index: int) -> int:
        """The block's major rank."""
        if self.request:
            return self.base
        return self.base + (index - self.lo if self.asc else self.hi - 1 - index)

    def low(self) -> RankKey:
        """The key of the run's least recent block (its heap key)."""
        if self.request:
            return (self.base, 1 - self.hi, self.seg)
        return (self.base, 0, self.seg)

    def part(self, lo: int, hi: int) -> _RankRun:
        """The sub-run over ``[lo, hi)`` with the same ranks."""
        if self.request:
            return _RankRun(self.seg, lo, hi, self.base, False, True)
        base = self.rank(lo) if self.asc else self.rank(hi - 1)
        return _RankRun(self.seg, lo, hi, base, self.asc)

    def older_than(self, lo: int, hi: int, major: int) -> tuple[int, int]:
        """The sub-range of ``[lo, hi)`` (inside this run) whose major rank is below ``major``."""
        if self.request:
            return (lo, hi) if self.base < major else (lo, lo)
        if self.asc:  # rank(i) = base + i - self.lo < major
            return lo, max(lo, min(hi, self.lo + major - self.base))
        # rank(i) = base + self.hi - 1 - i < major  <=>  i >= self.hi - (major - base)
        return min(hi, max(lo, self.hi - (major - self.base))), hi


class LRUPolicy(TierPolicy):
    """vLLM's LRU: stores and request-scoped accesses are uses; evict the least recent."""

    name = "lru"
    #: ``request_ranks``: 1 = vLLM 0.33's request-scoped ranks (see the module docstring);
    #: 0 = vLLM 0.32's per-store ranks. The engine adapter sets it from the installed vLLM.
    defaults = {"request_ranks": 0.0}

    def __init__(self, params: dict[str, float] | None = None) -> None:
        super().__init__(params)
        self._next_rank = 0
        self._by_seg: dict[int, list[_RankRun]] = {}
        self._heap: list[tuple[RankKey, int, _RankRun]] = []
        self._uid = itertools.count()
        self._request_ranked = bool(self.params["request_ranks"])
        self._request_rank: dict[Hashable, int] = {}

    # --- rank-run bookkeeping ---------------------------------------------------------------

    def _add(self, run: _RankRun) -> None:
        runs = self._by_seg.setdefault(run.seg, [])
        runs.insert(bisect_left([r.lo for r in runs], run.lo), run)
        heapq.heappush(self._heap, (run.low(), next(self._uid), run))

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
            heapq.heappush(self._heap, (piece.low(), next(self._uid), piece))

    def _rank_range(self, seg: int, lo: int, hi: int, asc: bool) -> None:
        self._cut(seg, lo, hi)
        run = _RankRun(seg, lo, hi, self._next_rank + 1, asc)
        self._next_rank += hi - lo
        self._add(run)

    def _rank_of(self, request: Hashable) -> int:
        """The request's one rank, taken from the counter at its first access (vLLM 0.33)."""
        rank = self._request_rank.get(request)
        if rank is None:
            self._next_rank += 1
            rank = self._request_rank[request] = self._next_rank
            if len(self._request_rank) > _REQUEST_RANKS_KEPT:
                del self._request_rank[next(iter(self._request_rank))]
        return rank

    def _request_range(self, seg: int, lo: int, hi: int, rank: int) -> None:
        self._cut(seg, lo, hi)
        self._add(_RankRun(seg, lo, hi, rank, False, True))

    # --- hooks ------------------------------------------------------------------------------

    def on_insert(self, run: Run, now: float) -> None:
        self._rank_range(run.seg, run.start, run.stop, asc=True)

    def on_request_insert(self, request: Hashable, run: Run, now: float) -> None:
        if not self._request_ranked:
            self.on_insert(run, now)
            return
        self._request_range(run.seg, run.start, run.stop, self._rank_of(request))

    def on_request_access(self, request: Hashable, runs: Sequence[Run], now: float) -> None:
        if not self._request_ranked:
            return
        # vLLM 0.33: the rank is taken even when none of the keys is held; a held block moves
        # up to (request rank, -position) unless it already ranks at least that high.
        rank = self._rank_of(request)
        older: list[tuple[int, int, int]] = []
        for piece in self.tier.resident(runs):
            for run in self._by_seg.get(piece.seg, ()):
                lo, hi = max(run.lo, piece.start), min(run.hi, piece.stop)
                if lo < hi:
                    a, b = run.older_than(lo, hi, rank)
                    if a < b:
                        older.append((piece.seg, a, b))
        for seg, lo, hi in older:
            self._request_range(seg, lo, hi, rank)

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
        popped: list[tuple[RankKey, int, _RankRun]] = []
        #: Heap entries of request runs' untaken remainders, valid during this selection only.
        partial: set[int] = set()
        heap = self._heap
        while heap and need > 0:
            entry = heapq.heappop(heap)
            key, uid, run = entry
            if not run.alive:
                continue
            if uid in partial:
                partial.discard(uid)
            elif key != run.low():
                continue  # stale
            else:
                popped.append(entry)
            spans = _unprotected(run.lo, run.hi, guard.get(run.seg), run.asc)
            if run.request:
                spans = self._merge_request_run(run, key, spans, partial)
            for lo, hi in spans:
                take = min(need, hi - lo)
                # Ranks rise from lo (a store) or from hi - 1 (an access): take the low end.
                if run.asc:
                    chosen.append(Victim(Run(run.seg, lo, lo + take), EvictionClass.RECENCY))
                else:
                    chosen.append(Victim(Run(run.seg, hi - take, hi), EvictionClass.RECENCY, True))
                need -= take
                if need == 0:
                    break
        if partial:  # remainders this selection did not reach: no longer valid
            heap[:] = [e for e in heap if e[1] not in partial]
            heapq.heapify(heap)
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

    def _merge_request_run(
        self, run: _RankRun, key: RankKey, spans: list[tuple[int, int]], partial: set[int]
    ) -> list[tuple[int, int]]:
        """The spans of a request run that come before the next run in rank order.

        Only runs of the same request (other segments) can interleave with it: the blocks up to
        the next one's least recent block are taken now, the rest goes back on the heap as a
        remainder entry of this selection.
        """
        upto = 1 - key[1]  # blocks at index >= upto were taken already
        spans = [(lo, min(hi, upto)) for lo, hi in spans if lo < upto]
        top = self._live_top(partial)
        if top is None or top[0] != run.base:
            return spans
        # Ours before the top's (index t, segment s): index > t, or index == t and older seg.
        limit = -top[1] + (0 if run.seg < top[2] else 1)
        if all(lo >= limit for lo, _ in spans):
            return spans
        uid = next(self._uid)
        partial.add(uid)
        heapq.heappush(self._heap, ((run.base, 1 - limit, run.seg), uid, run))
        return [(max(lo, limit), hi) for lo, hi in spans if hi > limit]

    def _live_top(self, partial: set[int]) -> RankKey | None:
        """The heap's lowest current key (stale entries on top are dropped)."""
        heap = self._heap
        while heap:
            key, uid, run = heap[0]
            if run.alive and (uid in partial or key == run.low()):
                return key
            heapq.heappop(heap)
        return None

    def fingerprint(self) -> bytes:
        runs = sorted(
            (r.seg, r.lo, r.hi, r.base, r.asc, r.request)
            for rs in self._by_seg.values()
            for r in rs
        )
        extra = {k: v for k, v in vars(self).items() if k not in _LRU_INTERNALS}
        return pickle.dumps((self._next_rank, runs, extra))

    def _compact(self) -> None:
        live = sum(len(runs) for runs in self._by_seg.values())
        if len(self._heap) > max(64, 4 * live):
            self._heap = [(r.low(), next(self._uid), r) for rs in self._by_seg.values() for r in rs]
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
