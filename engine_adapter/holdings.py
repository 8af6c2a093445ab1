"""The chunks vLLM holds for the policy, and what each one is to the core's tier.

Invariant: every key in :attr:`Holdings.chunks` is either resident in the tier (placed in the
key map) or *doomed* (the core dropped it, vLLM still holds the chunk because a transfer pins
it, or no manager can free it yet); staged keys are admitted by the core and about to be
inserted by vLLM. Keys reused by other sessions (shared prefixes) remember where they sit in
those sessions' contexts: when the owner's blocks are reclaimed (last turn, host TTL) a live
sharer inherits them instead of losing them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from vllm.v1.kv_offload.base import OffloadKey
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from tenure.engine_adapter.key_map import KeyMap, Loc
from tenure.engine_adapter.sessions import Sessions
from tenure.service.policy import EvictionClass, Run, Victim

__all__ = ["Holdings"]


class Holdings:
    """vLLM's chunks, the pinned, doomed and staged among them, and shared prefixes."""

    __slots__ = (
        "can_release",
        "chunks",
        "doomed",
        "keys",
        "pinned",
        "released",
        "sessions",
        "sharers",
        "staged",
        "stats",
        "tier",
    )

    def __init__(
        self, keys: KeyMap, sessions: Sessions, stats: Counter[str], *, can_release: bool
    ) -> None:
        self.keys = keys
        self.tier = keys.tier
        self.sessions = sessions
        self.stats = stats
        #: The manager can free chunks on its own (reclaim, TTL, pushed decisions).
        self.can_release = can_release
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        #: Keys a transfer pins (vLLM never evicts them).
        self.pinned: set[OffloadKey] = set()
        #: Keys the tier no longer holds but vLLM still does: evicted first, with their class.
        self.doomed: dict[OffloadKey, EvictionClass] = {}
        #: Keys of an admitted offer that vLLM is about to insert.
        self.staged: set[OffloadKey] = set()
        #: Shared prefix key -> session -> where it sits in that session's context.
        self.sharers: dict[OffloadKey, dict[str, Loc]] = {}
        #: Chunks dropped outside ``evict``, for the manager's pool (:meth:`take_released`).
        self.released: list[tuple[OffloadKey, ChunkStatus]] = []

    def doom(self, key: OffloadKey, cls: EvictionClass) -> None:
        """The tier no longer holds ``key`` but vLLM still does: evict it first."""
        self.keys.unplace(key)
        self.doomed[key] = cls

    def remove(self, key: OffloadKey) -> None:
        """vLLM dropped ``key``'s chunk itself: forget it everywhere."""
        self.chunks.pop(key, None)
        self.pinned.discard(key)
        self.doomed.pop(key, None)
        self.sharers.pop(key, None)
        keys = self.keys
        if key in keys.loc:
            run = keys.run_of(key)
            keys.unplace(key)
            self.tier.drop([run])

    def drop_victims(self, victims: Sequence[Victim], now: float) -> None:
        """Blocks the core dropped outside a store (reclaim, TTL): hand them over or doom them."""
        keys, chunks = self.keys, self.chunks
        for victim in victims:
            for key in keys.keys_of(victim.run):
                owner = self.tier.owner(keys.loc[key][0])
                keys.unplace(key)
                if key not in chunks:
                    # Staged by an offer vLLM never placed (stock manager): nothing to free.
                    self.staged.discard(key)
                    continue
                if victim.cls in (EvictionClass.RECLAIM, EvictionClass.TTL) and self._inherit(
                    key, owner, now
                ):
                    continue
                self.sharers.pop(key, None)
                self.doomed[key] = victim.cls
        if victims and self.can_release:
            self.release_doomed()

    def _inherit(self, key: OffloadKey, owner: str, now: float) -> bool:
        sharers = self.sharers.get(key)
        if not sharers:
            return False
        keys, ended = self.keys, self.sessions.ended
        for session, loc in list(sharers.items()):
            del sharers[session]
            if session == owner or session in ended:
                continue
            if keys.occupant(*loc) is not None:
                continue
            keys.place(key, loc)
            if self.tier.store([Run(loc[0], loc[1], loc[1] + 1)], session, now).admitted:
                self.stats["inherited_blocks"] += 1
                return True
            keys.unplace(key)
        return False

    def release_doomed(self) -> None:
        """Hand every doomed chunk no transfer pins to :attr:`released`."""
        for key in [k for k in self.doomed if k not in self.pinned]:
            cls = self.doomed.pop(key)
            chunk = self.chunks.pop(key, None)
            if chunk is None:
                continue
            self.sharers.pop(key, None)
            self.released.append((key, chunk))
            self.stats[f"evicted_blocks_{cls.value}"] += 1

    def take_released(self) -> list[tuple[OffloadKey, ChunkStatus]]:
        """Chunks dropped outside ``evict``; the manager returns them to its pool."""
        if self.can_release and self.doomed:
            self.release_doomed()
        out, self.released = self.released, []
        return out
