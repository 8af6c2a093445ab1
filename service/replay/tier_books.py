"""Bookkeeping the SSD-tier model keeps beside the tiers: observed residency and use counts."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

import numpy as np

from tenure.service.policy import HostTier, Run, TierPolicy, Victim
from tenure.service.policy.types import StoreResult

__all__ = ["ObservedTier", "TierOwner", "UseCounts", "WriteLedger", "pieces"]


class TierOwner(Protocol):
    """What an :class:`ObservedTier` reports to (the replay's ``LowerTier``)."""

    now: float

    def charge(self, tier: str, seg: int, blocks: int) -> None: ...

    def on_evicted(self, tier: HostTier, victims: Sequence[Victim]) -> None: ...


class ObservedTier(HostTier):
    """A :class:`HostTier` that reports residency changes and evictions to its owner."""

    def __init__(
        self, policy: TierPolicy, capacity: int | None, owner: TierOwner, name: str
    ) -> None:
        self._owner = owner
        self.name = name
        super().__init__(policy, capacity)

    def store(
        self,
        runs: Sequence[Run],
        session: str,
        now: float,
        *,
        misses: Sequence[Run] | None = None,
        request: Hashable | None = None,
    ) -> StoreResult:
        self._owner.now = now
        return super().store(runs, session, now, misses=misses, request=request)

    def expire(self, now: float) -> list[Victim]:
        self._owner.now = now
        return super().expire(now)

    def _set(self, run: Run) -> None:
        super()._set(run)
        self._owner.charge(self.name, run.seg, run.stop - run.start)

    def _unset(self, run: Run) -> None:
        super()._unset(run)
        self._owner.charge(self.name, run.seg, -(run.stop - run.start))

    def _clear(self, victims: Sequence[Victim]) -> None:
        self._owner.on_evicted(self, victims)
        super()._clear(victims)


class UseCounts:
    """Per-block use counts (saturating at 255), one numpy array per segment, grown on demand."""

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray[Any, np.dtype[np.uint8]]] = {}

    def bump(self, run: Run) -> tuple[np.ndarray[Any, np.dtype[np.uint8]], int]:
        """Add one use to ``run``'s blocks; returns the counts before, and the run start."""
        arr = self._arrays.get(run.seg)
        if arr is None or arr.size < run.stop:
            grown = np.zeros(max(run.stop, 2 * (0 if arr is None else arr.size)), np.uint8)
            if arr is not None:
                grown[: arr.size] = arr
            arr = self._arrays[run.seg] = grown
        view = arr[run.start : run.stop]
        before = view.copy()
        np.minimum(view.astype(np.uint16) + 1, 255, out=view, casting="unsafe")
        return before, run.start

    def at_least(self, run: Run, n: int) -> list[Run]:
        """Pieces of ``run`` whose blocks have been used at least ``n`` times."""
        arr = self._arrays.get(run.seg)
        if arr is None:
            return []
        hi = min(run.stop, arr.size)
        if hi <= run.start:
            return []
        return pieces(run.seg, run.start, arr[run.start : hi] >= n)


def pieces(seg: int, start: int, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> list[Run]:
    """Maximal runs of ``True`` in ``mask`` (block ``start + i``) as runs of ``seg``."""
    if not mask.any():
        return []
    padded = np.concatenate(([False], mask, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [
        Run(seg, start + int(a), start + int(b))
        for a, b in zip(edges[::2], edges[1::2], strict=True)
    ]


class WriteLedger:
    """Per-block SSD write history, for the write decomposition in the placement report.

    A block is 0 (never written), 1 (written, not read back since) or 2 (written, then read
    back: promoted into DRAM for a hit). Freeing or evicting a block from the SSD leaves its
    state, so a second write of it is seen as a rewrite.
    """

    def __init__(self) -> None:
        self._arrays: dict[int, np.ndarray[Any, np.dtype[np.uint8]]] = {}

    def _view(self, run: Run) -> np.ndarray[Any, np.dtype[np.uint8]]:
        arr = self._arrays.get(run.seg)
        if arr is None or arr.size < run.stop:
            grown = np.zeros(max(run.stop, 2 * (0 if arr is None else arr.size)), np.uint8)
            if arr is not None:
                grown[: arr.size] = arr
            arr = self._arrays[run.seg] = grown
        return arr[run.start : run.stop]

    def written(self, run: Run) -> int:
        """Mark ``run`` written; returns how many of its blocks had been written before."""
        view = self._view(run)
        before = int(np.count_nonzero(view))
        view[:] = 1
        return before

    def read(self, run: Run) -> int:
        """Mark ``run`` read back; returns how many blocks were written and unread until now."""
        arr = self._arrays.get(run.seg)
        if arr is None:
            return 0
        view = arr[run.start : min(run.stop, arr.size)]
        fresh = view == 1
        n = int(np.count_nonzero(fresh))
        view[fresh] = 2
        return n
