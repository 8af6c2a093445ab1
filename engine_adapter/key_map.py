"""The key <-> (segment, block index) map between vLLM's block keys and the core's runs.

Every resident key has one owner location; the index comes from the key's token position
(the block size is learned from positions under vLLM's stock manager), so a session's context
maps to a few long runs and the core's cost grows with sessions, not blocks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext

from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.policy import EvictionClass, HostTier, Run, Victim

__all__ = ["KeyMap", "Loc", "merge_locs", "victim_keys"]

#: ``(segment, block index)``: where a key sits in the core's tier.
Loc = tuple[int, int]


class KeyMap:
    """Placing keys at locations of the tier's segments, and reading runs of keys back.

    The per-offer loops of the store gate and the policy read :attr:`loc` and :attr:`key_at`
    directly (bound to locals): they run for every block of every offer, where a method call
    per block is most of their cost (``tenure bench policy``).
    """

    __slots__ = ("block_tokens", "fork_serial", "forks", "frontier", "key_at", "loc", "tier")

    def __init__(self, tier: HostTier, block_tokens: int = 0) -> None:
        self.tier = tier
        #: Key -> its owner location.
        self.loc: dict[OffloadKey, Loc] = {}
        #: Segment -> block index -> the key placed there (``None``: a free slot).
        self.key_at: list[list[OffloadKey | None]] = []
        #: Segment -> one past its newest placed index (a session's frontier).
        self.frontier: list[int] = []
        #: Base segment -> its fork segments (context edits, same-position KV groups).
        self.forks: dict[int, list[int]] = {}
        self.fork_serial = 0
        #: Tokens per offloaded block; 0 = learn it from key positions (stock manager).
        self.block_tokens = block_tokens

    def segment(self, session: str, name: Any) -> int:
        seg = self.tier.segment((session, name), session)
        while len(self.key_at) <= seg:
            self.key_at.append([])
            self.frontier.append(0)
        return seg

    def index(self, key: OffloadKey, ctx: ReqContext | None, fallback: int) -> int:
        """``key``'s block index from its token position (``fallback`` when it has none)."""
        pos = ctx.get_offload_key_position(key) if ctx is not None else None
        if pos is None or pos <= 0:
            return fallback
        if self.block_tokens <= 0 or pos % self.block_tokens:
            # Learn the block size (vLLM's stock manager does not say it): the gcd of every
            # position the request has, not just this key's, so a request whose tail is
            # offered first does not set it to a multiple of the block.
            unit = max(self.block_tokens, 0)
            for p in offload_key_positions(ctx).values() if ctx is not None else (pos,):
                unit = math.gcd(unit, p)
            self.block_tokens = math.gcd(unit, pos)
        return pos // self.block_tokens - 1

    def occupant(self, seg: int, index: int) -> OffloadKey | None:
        slots = self.key_at[seg]
        return slots[index] if index < len(slots) else None

    def place(self, key: OffloadKey, loc: Loc) -> None:
        seg, index = loc
        slots = self.key_at[seg]
        if len(slots) <= index:
            slots.extend([None] * (index + 1 - len(slots)))
        slots[index] = key
        self.loc[key] = loc
        if index + 1 > self.frontier[seg]:
            self.frontier[seg] = index + 1

    def unplace(self, key: OffloadKey) -> Loc | None:
        loc = self.loc.pop(key, None)
        if loc is not None:
            self.key_at[loc[0]][loc[1]] = None
        return loc

    def keys_of(self, run: Run) -> list[OffloadKey]:
        slots = self.key_at[run.seg]
        out: list[OffloadKey] = []
        for index in range(run.start, min(run.stop, len(slots))):
            key = slots[index]
            if key is not None:
                out.append(key)
        return out

    def runs_of(self, keys: Iterable[OffloadKey]) -> list[Run]:
        """The runs the placed ones of ``keys`` occupy."""
        loc = self.loc
        return merge_locs(sorted(loc[k] for k in keys if k in loc))

    def run_of(self, key: OffloadKey) -> Run:
        seg, index = self.loc[key]
        return Run(seg, index, index + 1)

    def fork(
        self,
        session: str,
        name: Any,
        current: int,
        index: int,
        planned: Sequence[tuple[OffloadKey, int, int]],
    ) -> int:
        """A segment of ``session``'s context ``name`` whose slot ``index`` is free and not
        claimed by ``planned`` (a new fork segment if none is)."""
        base = self.segment(session, name)
        forks = self.forks.setdefault(base, [])
        claimed = {s for _, s, i in planned if i == index}
        for seg in (base, *forks):
            if seg != current and seg not in claimed and self.occupant(seg, index) is None:
                return seg
        self.fork_serial += 1
        seg = self.segment(session, (name, "fork", self.fork_serial))
        forks.append(seg)
        return seg


def victim_keys(
    key_at: list[list[OffloadKey | None]], victim: Victim
) -> list[tuple[OffloadKey, EvictionClass]]:
    """The keys of ``victim``'s blocks with its class, in the order the core evicts them."""
    seg, start, stop = victim.run
    keys = key_at[seg][start:stop]
    if victim.descending:
        keys.reverse()
    cls = victim.cls
    return [(k, cls) for k in keys if k is not None]


def merge_locs(locs: Sequence[Loc]) -> list[Run]:
    """``(segment, index)`` pairs in order -> maximal runs (a ``Run`` made per run only)."""
    runs: list[Run] = []
    seg = start = stop = -1
    for s, index in locs:
        if s == seg and index == stop:
            stop += 1
            continue
        if seg >= 0:
            runs.append(Run(seg, start, stop))
        seg, start, stop = s, index, index + 1
    if seg >= 0:
        runs.append(Run(seg, start, stop))
    return runs
