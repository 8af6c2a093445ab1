"""vLLM's calls that carry no decision of their own: ``insert`` and ``on_store_miss``.

Under :class:`~tenure.engine_adapter.manager.TenureOffloadingManager` every insert was decided by
``begin_store``. Under vLLM's stock manager the policy sees an offer only piecewise (the new
misses at ``on_store_miss``, what vLLM protects at ``evict``, a store that needs no room only at
``insert``): this part rebuilds the offer and its request from what vLLM reported, and has the
store gate decide it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from tenure.engine_adapter.store_gate import StoreGate
from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.policy import EvictionClass

__all__ = ["RECENT_REQUESTS", "StockPath"]

#: Requests whose reported store misses the stock-manager path remembers.
RECENT_REQUESTS = 256


class StockPath:
    """Inserts, reported misses, and the offer behind a bare ``evict()``."""

    __slots__ = ("capacity", "gate", "holdings", "keys", "misses", "requests")

    def __init__(self, gate: StoreGate, capacity: int) -> None:
        self.gate = gate
        self.holdings = gate.holdings
        self.keys = gate.keys
        self.requests = gate.requests
        #: vLLM's ``cache_capacity`` (chunks).
        self.capacity = capacity
        #: Recent requests' reported misses (key -> order), to find the request and the store
        #: behind a bare evict() when vLLM did not report (a retried offer).
        self.misses: OrderedDict[int, tuple[ReqContext, dict[OffloadKey, None]]] = OrderedDict()

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: Any = None) -> None:
        # vLLM 0.32 calls insert(key, chunk); 0.33 adds the request context.
        holdings = self.holdings
        staged, loc = holdings.staged, self.keys.loc
        if key not in staged and key not in loc:
            self._decide_insert(key, req_context)
        holdings.chunks[key] = chunk
        if chunk.ref_cnt != 0:
            holdings.pinned.add(key)
        if key in staged:
            staged.discard(key)
        elif key not in loc:
            # Refused, or no slot for it: vLLM holds it anyway, so it is the first to go.
            holdings.doomed[key] = EvictionClass.RECENCY

    def _decide_insert(self, key: OffloadKey, req_context: Any) -> None:
        """A key vLLM inserts without a decision: a stock-manager store that needed no room
        (no evict call), or a policy driven by hand. Decided now, so the tier accounts for
        every chunk vLLM holds."""
        gate = self.gate
        stash = gate.pending
        ctx: ReqContext | None
        if (
            stash is not None
            and key in stash[0]
            and len(stash[0]) <= self.capacity - len(self.holdings.chunks)
        ):
            # The misses on_store_miss reported for this store. (One that did not fit the free
            # room needed evict(): if none came, vLLM dropped that store and it is stale.)
            offer, ctx = stash
        else:
            offer = [key]
            ctx = req_context if isinstance(req_context, ReqContext) else self._ctx_for(key)
        if not gate.begin_store(offer, ctx):
            gate.refused = False  # vLLM stores anyway
        surplus, gate.staged_victims = gate.staged_victims, None
        for victim, cls in surplus or ():
            self.holdings.doom(victim, cls)  # room vLLM did not need: evicted first, later

    def _ctx_for(self, key: OffloadKey) -> ReqContext | None:
        """The most recent request that reported ``key`` or has its position (stock manager)."""
        for ctx, seen in reversed(self.misses.values()):
            if key in seen or key in offload_key_positions(ctx):
                return ctx
        return self.requests.last_ctx

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # TenureOffloadingManager has decided the offer already (its keys are staged). Under
        # vLLM's stock manager this call sees only the offer's new misses, and the keys vLLM
        # protects are known at evict(): remember the misses, decide there (or at insert()).
        keys = list(keys)
        staged, chunks = self.holdings.staged, self.holdings.chunks
        if all(k in staged or k in chunks for k in keys):
            return
        self.gate.pending = (keys, req_context)
        self.requests.last_ctx = req_context
        misses = self.misses
        entry = misses.get(id(req_context))
        if entry is None or entry[0] is not req_context:
            entry = misses[id(req_context)] = (req_context, {})
            if len(misses) > RECENT_REQUESTS:
                misses.popitem(last=False)
        elif len(misses) > 1:
            misses.move_to_end(id(req_context))
        entry[1].update(dict.fromkeys(keys))  # what vLLM reported, in report order

    def stashed_offer(
        self, n: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], ReqContext | None]:
        """The whole offer behind ``evict(n, protected)`` under the stock manager, in order,
        and the request making it (``protected`` is the offer; its misses are the store)."""
        gate = self.gate
        stash, gate.pending = gate.pending, None
        chunks = self.holdings.chunks
        held: list[OffloadKey] = []
        missing: list[OffloadKey] = []
        for key in protected:
            (held if key in chunks else missing).append(key)
        if (
            stash is not None
            and len(stash[0]) == len(missing)
            and all(k in protected and k not in chunks for k in stash[0])
        ):
            # The common case: on_store_miss reported exactly this store's misses, in order.
            return stash[0] + held, stash[1]
        entry: tuple[ReqContext, dict[OffloadKey, None]] | None = None
        for candidate in reversed(self.misses.values()):
            seen, where = candidate[1], offload_key_positions(candidate[0])
            if all(k in seen or k in where for k in missing):
                entry = candidate
                break
        ctx = entry[0] if entry is not None else self.requests.last_ctx
        if entry is not None:
            # vLLM stores n + its free chunks of them: with a store threshold, only the misses
            # it reported (the rest did not pass the threshold).
            want = n + self.capacity - len(chunks)
            if len(missing) > want:
                narrowed = [k for k in missing if k in entry[1]]
                if len(narrowed) == want:
                    missing = narrowed
        # vLLM inserts in offer order: the scheduler offers KV group by group, each in prefix
        # order; without positions, the order the misses were reported in.
        positions = offload_key_positions(ctx)
        if missing and all(k in positions for k in missing):
            missing.sort(key=lambda k: (k[-4:], positions[k]))
        elif entry is not None and missing and all(k in entry[1] for k in missing):
            order = {k: i for i, k in enumerate(entry[1])}
            missing.sort(key=order.__getitem__)
        return missing + held, ctx
