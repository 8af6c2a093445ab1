"""The GPU KV pool with vLLM-like prefix caching of finished requests.

vLLM keeps a finished request's full blocks cached (hashed) and puts them on a free queue in
reverse order, so a request's tail is evicted before its head, and evicts from the queue head
(least recently freed first) when a new allocation needs room. A block in use by a running
request is never evicted. Because every context is a path of segment prefixes
(:mod:`tenure.service.replay.model`) and eviction is tail-first, what a segment keeps cached is
always a prefix of it: the pool stores one cached length per segment and a free queue of segments,
so every operation costs per segment, not per block.

Admission reserves a request's whole footprint up front (its context plus output), so there is
no preemption; vLLM allocates step by step and preempts on shortage, which this model trades for
a conservative FCFS admission (the head of the queue waits until it fits).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from tenure.service.policy.types import Run

__all__ = ["GpuPrefixCache"]


class GpuPrefixCache:
    def __init__(self, capacity_blocks: int, segments: int) -> None:
        self.capacity = capacity_blocks
        self.cached = [0] * segments  # cached prefix length of each segment
        self.refs = [0] * segments  # running requests using each segment
        self._free: OrderedDict[int, None] = OrderedDict()  # evictable segments, LRU first
        self.held = 0  # cached blocks + reserved extra blocks
        self.evictable = 0  # cached blocks of unreferenced segments
        self.evicted_blocks = 0

    def hit(self, runs: Sequence[Run]) -> int:
        """Blocks of ``runs`` cached from the start (vLLM's local prefix-cache hit)."""
        hit = 0
        cached = self.cached
        for seg, _start, stop in runs:
            c = cached[seg]
            if c < stop:
                return hit + c
            hit += stop
        return hit

    def admit(self, runs: Sequence[Run], extra_blocks: int) -> bool:
        """Reserve ``runs`` (pinned, filled) and ``extra_blocks``; ``False`` if it cannot fit."""
        cached = self.cached
        need = extra_blocks
        own_free = 0
        for seg, _start, stop in runs:
            c = cached[seg]
            if c < stop:
                need += stop - c
            if seg in self._free:
                # Only the part this request pins; a dead tail past it stays evictable.
                own_free += min(c, stop)
        empty = self.capacity - self.held
        if need > empty + self.evictable - own_free:
            return False
        for seg, _start, stop in runs:
            if self.refs[seg] == 0 and seg in self._free:
                del self._free[seg]
                self.evictable -= cached[seg]
                if cached[seg] > stop:
                    # The branch leaves the segment's tail dead (a rewritten last block or a
                    # compaction): drop it now rather than pin it with the live head.
                    dead = cached[seg] - stop
                    cached[seg] = stop
                    self.held -= dead
                    self.evicted_blocks += dead
            self.refs[seg] += 1
        deficit = need - (self.capacity - self.held)
        while deficit > 0:
            seg = next(iter(self._free))
            take = min(cached[seg], deficit)
            cached[seg] -= take
            self.held -= take
            self.evictable -= take
            self.evicted_blocks += take
            deficit -= take
            if cached[seg] == 0:
                del self._free[seg]
        for seg, _start, stop in runs:
            if cached[seg] < stop:
                self.held += stop - cached[seg]
                cached[seg] = stop
        self.held += extra_blocks
        return True

    def release(self, runs: Sequence[Run], extra_blocks: int) -> None:
        """A request finished: its blocks stay cached, freed tail first."""
        self.held -= extra_blocks
        for seg, _start, _stop in reversed(runs):
            self.refs[seg] -= 1
            if self.refs[seg] == 0 and self.cached[seg] > 0:
                self._free[seg] = None
                self._free.move_to_end(seg)
                self.evictable += self.cached[seg]
