"""The key <-> (segment, block index) map between vLLM's block keys and the core's runs.

Every resident key has one owner location; the index comes from the key's token position
(the block size is learned from positions under vLLM's stock manager), so a session's context
maps to a few long runs and the core's cost grows with sessions, not blocks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext

from tenure.engine_adapter.policy_state import Loc, PolicyState, RequestInfo
from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.policy import EvictionClass, Run, Victim

__all__ = ["KeyMap", "merge_locs", "victim_keys"]


class KeyMap(PolicyState):
    """Placing keys at locations, and reading runs of keys back."""

    def _segment(self, session: str, name: Any) -> int:
        seg = self.tier.segment((session, name), session)
        while len(self._key_at) <= seg:
            self._key_at.append([])
            self._frontier.append(0)
        return seg

    def _index(self, key: OffloadKey, ctx: ReqContext | None, info: RequestInfo) -> int:
        pos = ctx.get_offload_key_position(key) if ctx is not None else None
        if pos is None or pos <= 0:
            return info.next_index
        if self.block_tokens <= 0 or pos % self.block_tokens:
            # Learn the block size (vLLM's stock manager does not say it): the gcd of every
            # position the request has, not just this key's, so a request whose tail is
            # offered first does not set it to a multiple of the block.
            unit = max(self.block_tokens, 0)
            for p in offload_key_positions(ctx).values() if ctx is not None else (pos,):
                unit = math.gcd(unit, p)
            self.block_tokens = math.gcd(unit, pos)
        return pos // self.block_tokens - 1

    def _occupant(self, seg: int, index: int) -> OffloadKey | None:
        slots = self._key_at[seg]
        return slots[index] if index < len(slots) else None

    def _place(self, key: OffloadKey, loc: Loc) -> None:
        seg, index = loc
        slots = self._key_at[seg]
        if len(slots) <= index:
            slots.extend([None] * (index + 1 - len(slots)))
        slots[index] = key
        self._loc[key] = loc
        if index + 1 > self._frontier[seg]:
            self._frontier[seg] = index + 1

    def _unplace(self, key: OffloadKey) -> Loc | None:
        loc = self._loc.pop(key, None)
        if loc is not None:
            self._key_at[loc[0]][loc[1]] = None
        return loc

    def _keys_of(self, run: Run) -> list[OffloadKey]:
        slots = self._key_at[run.seg]
        out: list[OffloadKey] = []
        for index in range(run.start, min(run.stop, len(slots))):
            key = slots[index]
            if key is not None:
                out.append(key)
        return out

    def _pinned_runs(self) -> list[Run]:
        locs = [self._loc[k] for k in self._pinned if k in self._loc]
        return merge_locs(sorted(locs))

    def _doom(self, key: OffloadKey, cls: EvictionClass) -> None:
        """The tier no longer holds ``key`` but vLLM still does: evict it first."""
        self._unplace(key)
        self._doomed[key] = cls

    def _run_of(self, key: OffloadKey) -> Run:
        seg, index = self._loc[key]
        return Run(seg, index, index + 1)


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
