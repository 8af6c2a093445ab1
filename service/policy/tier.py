"""Host-tier bookkeeping: residency, capacity and counters, with the decisions left to a policy.

Residency is one ``bytearray`` bitmap per segment, so the hot operations (prefix lookup, finding
the missing part of an offer, marking a run stored or evicted) are single C-level ``find`` /
slice calls instead of per-block Python loops. The tier is the *manager* of vLLM's design: it
keeps the books and enforces the contract; :class:`~tenure.service.policy.base.TierPolicy` decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator, Sequence

from tenure.service.policy.base import TierPolicy
from tenure.service.policy.types import Run, SessionHint, StoreResult, Victim

__all__ = ["HostTier"]

_ONES = b"\x01" * 65536
_ZEROS = b"\x00" * 65536


def _fill(bitmap: bytearray, start: int, stop: int, value: bytes) -> None:
    while start < stop:
        step = min(stop - start, len(value))
        bitmap[start : start + step] = value[:step]
        start += step


class HostTier:
    """One capacity-bounded tier of KV blocks governed by ``policy``.

    ``capacity_blocks=None`` (or an unbounded policy) means no limit. Segments are interned:
    callers name them with any hashable key and a owning session, and use the returned int id
    in :class:`Run` values.
    """

    def __init__(self, policy: TierPolicy, capacity_blocks: int | None) -> None:
        if capacity_blocks is not None and capacity_blocks < 0:
            raise ValueError(f"capacity_blocks must be >= 0, got {capacity_blocks}")
        self.policy = policy
        self.capacity: int | None = None if policy.unbounded else capacity_blocks
        if policy.no_capacity:
            self.capacity = 0
        self.used = 0
        self.counters: Counter[str] = Counter()
        self._seg_ids: dict[Hashable, int] = {}
        self._seg_keys: list[Hashable] = []
        self._seg_owner: list[str] = []
        self._bitmaps: list[bytearray] = []
        self._seg_resident: list[int] = []
        self._session_segments: dict[str, list[int]] = {}
        self.session_resident: Counter[str] = Counter()
        policy.attach(self)

    # --- segments ---------------------------------------------------------------------------

    def segment(self, key: Hashable, session: str) -> int:
        """Intern segment ``key`` owned by ``session``; returns its id (stable for the tier)."""
        seg = self._seg_ids.get(key)
        if seg is None:
            seg = len(self._seg_owner)
            self._seg_ids[key] = seg
            self._seg_keys.append(key)
            self._seg_owner.append(session)
            self._bitmaps.append(bytearray())
            self._seg_resident.append(0)
            self._session_segments.setdefault(session, []).append(seg)
        return seg

    def owner(self, seg: int) -> str:
        return self._seg_owner[seg]

    def segments_of(self, session: str) -> Sequence[int]:
        return self._session_segments.get(session, ())

    def resident_blocks(self, seg: int) -> int:
        return self._seg_resident[seg]

    def resident_sessions(self) -> Iterator[tuple[str, int]]:
        """(session, resident blocks) for every session holding blocks."""
        return ((s, n) for s, n in self.session_resident.items() if n > 0)

    def is_resident(self, seg: int, index: int) -> bool:
        bitmap = self._bitmaps[seg]
        return index < len(bitmap) and bitmap[index] == 1

    def tail_runs(self, seg: int, n: int) -> list[Run]:
        """Up to ``n`` resident blocks of ``seg`` taken from its tail, as runs (tail first)."""
        bitmap = self._bitmaps[seg]
        runs: list[Run] = []
        end = len(bitmap)
        while n > 0:
            last = bitmap.rfind(1, 0, end)
            if last < 0:
                break
            first = bitmap.rfind(0, 0, last)
            start = max(first + 1, last + 1 - n)
            runs.append(Run(seg, start, last + 1))
            n -= last + 1 - start
            end = start
        return runs

    # --- queries ----------------------------------------------------------------------------

    def lookup(self, runs: Sequence[Run], *, session: str | None = None, now: float = 0.0) -> int:
        """Number of consecutive resident blocks from the start of ``runs`` (a prefix hit).

        A pure query; with ``session`` (a request's lookup from its GPU hit on) the policy is
        told what it found (``on_lookup``)."""
        hit = self._lookup(runs)
        if session is not None:
            self.looked_up(session, sum(r.blocks for r in runs), hit, now)
        return hit

    def looked_up(self, session: str, blocks: int, hit: int, now: float) -> None:
        """A lookup made elsewhere (the engine's manager, key by key): ``session``'s admitted
        request looked up ``blocks`` past its GPU hit and loads the first ``hit``."""
        self.policy.on_lookup(session, blocks, hit, now)

    def _lookup(self, runs: Sequence[Run]) -> int:
        hit = 0
        for seg, start, stop in runs:
            bitmap = self._bitmaps[seg]
            end = min(stop, len(bitmap))
            first_missing = bitmap.find(0, start, end) if start < end else start
            if first_missing < 0:
                first_missing = end
            hit += first_missing - start
            if first_missing < stop:
                return hit
        return hit

    def missing(self, runs: Sequence[Run]) -> list[Run]:
        """The non-resident parts of ``runs``, in order."""
        out: list[Run] = []
        for seg, start, stop in runs:
            bitmap = self._bitmaps[seg]
            if len(bitmap) < stop:
                bitmap.extend(bytes(stop - len(bitmap)))
            i = start
            while i < stop:
                j = bitmap.find(0, i, stop)
                if j < 0:
                    break
                k = bitmap.find(1, j, stop)
                if k < 0:
                    k = stop
                out.append(Run(seg, j, k))
                i = k
        return out

    def resident(self, runs: Sequence[Run]) -> list[Run]:
        """The resident parts of ``runs``, in order (the complement of :meth:`missing`)."""
        out: list[Run] = []
        for run in runs:
            start = run.start
            for gap in self.missing([run]):
                if gap.start > start:
                    out.append(Run(run.seg, start, gap.start))
                start = gap.stop
            if start < run.stop:
                out.append(Run(run.seg, start, run.stop))
        return out

    # --- mutations --------------------------------------------------------------------------

    def store(
        self,
        runs: Sequence[Run],
        session: str,
        now: float,
        *,
        misses: Sequence[Run] | None = None,
        request: Hashable | None = None,
    ) -> StoreResult:
        """Offer ``runs`` (a request's freshly computed blocks, prefix order) to the tier.

        All-or-nothing, as vLLM's ``prepare_store``: either every missing block is admitted
        (after the policy frees room) or none is and nothing changes. ``misses``: the missing
        blocks to report as store misses (vLLM reports a block once per request; default:
        all missing blocks). ``request``: the storing engine request, for policies whose
        ranks are request-scoped (vLLM 0.33's LRU).
        """
        pieces = self.missing(runs)
        n_missing = sum(p.stop - p.start for p in pieces)
        self.counters["store_offers"] += 1
        if n_missing == 0:
            return StoreResult(admitted=True, stored_blocks=0)
        self.policy.on_store_miss(pieces if misses is None else misses, now)
        victims: list[Victim] = []
        if self.capacity is not None:
            need = n_missing - (self.capacity - self.used)
            if need > 0:
                chosen = self.policy.select_victims(need, session, runs, now)
                if chosen is None:
                    self.counters["refusals"] += 1
                    self.counters["refused_blocks"] += n_missing
                    self.policy.on_refused(session, runs, now)
                    return StoreResult(admitted=False, stored_blocks=0)
                freed = sum(v.run.blocks for v in chosen)
                if freed != need:
                    raise AssertionError(
                        f"policy {self.policy.name!r} freed {freed} blocks, asked for {need}"
                    )
                self._clear(chosen)
                victims = chosen
        for piece in pieces:
            self._set(piece)
            if request is None:
                self.policy.on_insert(piece, now)
            else:
                self.policy.on_request_insert(request, piece, now)
        self.counters["stored_blocks"] += n_missing
        return StoreResult(admitted=True, stored_blocks=n_missing, victims=tuple(victims))

    def report_misses(self, runs: Sequence[Run], now: float) -> None:
        """Blocks were offered and missed, but the store did not go ahead (vLLM's manager had no
        evictable room): policies that learn from misses (ARC's ghost lists) still learn."""
        if runs:
            self.policy.on_store_miss(runs, now)

    def make_room(
        self, n: int, session: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        """Evict exactly ``n`` resident blocks outside ``protected`` with nothing stored (vLLM's
        bare ``evict``: room for chunks the tier does not count), or ``None`` and no change."""
        if n <= 0:
            return []
        if self.capacity is None:
            return None  # an unbounded tier has no victims to give (``infinite``)
        chosen = self.policy.select_victims(n, session, protected, now)
        if chosen is None:
            return None
        freed = sum(v.run.blocks for v in chosen)
        if freed != n:
            raise AssertionError(f"policy {self.policy.name!r} freed {freed} blocks, asked for {n}")
        self._clear(chosen)
        return chosen

    def access(
        self,
        runs: Sequence[Run],
        now: float,
        *,
        session: str | None = None,
        inserted: Sequence[Run] = (),
    ) -> list[Victim]:
        """A request finished having used ``runs`` (prefix order; vLLM's request-scoped access).

        ``session`` defaults to the owner of the first run; ``inserted`` are the runs the
        request stored itself (not a reuse). Returns what became due (e.g. the reclaim of a
        session whose declared last turn just finished).
        """
        if session is None:
            if not runs:
                return []
            session = self._seg_owner[runs[0].seg]
        self.policy.on_access(session, runs, inserted, now)
        return self.expire(now)

    def request_access(self, request: Hashable, runs: Sequence[Run], now: float) -> None:
        """``request`` used ``runs`` before finishing (vLLM 0.33's ``on_request_access``)."""
        self.policy.on_request_access(request, runs, now)

    def touch(self, runs: Sequence[Run], now: float, *, pending: Sequence[Run] = ()) -> None:
        """vLLM's ``touch``: ``runs`` (in the caller's order) were used, outside any request."""
        self.policy.on_touch(runs, pending, now)

    def request_start(self, session: str, now: float) -> None:
        self.policy.on_request_start(session, now)

    def request_admitted(self, session: str, now: float) -> None:
        """The engine admitted ``session``'s request (it leaves the queue: loads or computes)."""
        self.policy.on_request_admitted(session, now)

    def hint(self, session: str, hint: SessionHint, now: float) -> list[Victim]:
        """Pass lifecycle news to the policy, then drop whatever became due (e.g. reclaim)."""
        self.policy.on_hint(session, hint, now)
        return self.expire(now)

    def expire(self, now: float) -> list[Victim]:
        """Drop the blocks the policy says are due now (reclaim, TTL expiry)."""
        victims = self.policy.due(now)
        if victims:
            self._clear(victims)
        return victims

    def drop(self, runs: Sequence[Run]) -> int:
        """Remove resident blocks of ``runs`` by the caller's decision; returns blocks removed."""
        removed = 0
        for seg, start, stop in runs:
            bitmap = self._bitmaps[seg]
            stop = min(stop, len(bitmap))
            i = start
            while i < stop:
                j = bitmap.find(1, i, stop)
                if j < 0:
                    break
                k = bitmap.find(0, j, stop)
                if k < 0:
                    k = stop
                piece = Run(seg, j, k)
                self.policy.on_remove(piece)
                self._unset(piece)
                removed += k - j
                i = k
        return removed

    def drop_session(self, session: str) -> int:
        segs = self.segments_of(session)
        return self.drop([Run(seg, 0, len(self._bitmaps[seg])) for seg in segs])

    def forget_session(self, session: str) -> bool:
        """Drop a session that holds no blocks from the books (long-running engines call this
        for finished sessions so memory does not grow); returns whether it was forgotten."""
        if self.session_resident.get(session, 0) > 0:
            return False
        for seg in self._session_segments.pop(session, ()):
            self._bitmaps[seg] = bytearray()
            self._seg_ids.pop(self._seg_keys[seg], None)
        self.policy.forget(session)
        return True

    # --- internals --------------------------------------------------------------------------

    def _set(self, run: Run) -> None:
        seg, start, stop = run
        _fill(self._bitmaps[seg], start, stop, _ONES)
        n = stop - start
        self._seg_resident[seg] += n
        self.session_resident[self._seg_owner[seg]] += n
        self.used += n

    def _unset(self, run: Run) -> None:
        seg, start, stop = run
        _fill(self._bitmaps[seg], start, stop, _ZEROS)
        n = stop - start
        self._seg_resident[seg] -= n
        owner = self._seg_owner[seg]
        self.session_resident[owner] -= n
        if self.session_resident[owner] == 0:
            del self.session_resident[owner]
        self.used -= n

    def _clear(self, victims: Sequence[Victim]) -> None:
        for victim in victims:
            seg, start, stop = victim.run
            bitmap = self._bitmaps[seg]
            if stop > len(bitmap) or bitmap.count(1, start, stop) != stop - start:
                raise AssertionError(
                    f"policy {self.policy.name!r} chose non-resident blocks {victim.run}"
                )
            self._unset(victim.run)
            self.counters[f"evicted_blocks_{victim.cls.value}"] += stop - start
