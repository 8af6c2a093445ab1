"""Tenure's decision core behind vLLM's ``CachePolicy``: block keys in, session decisions out.

vLLM's offloading manager speaks in block keys (chained prefix hashes); the core speaks in
sessions and segments (runs of blocks). This class keeps the map between the two and the
vLLM-side facts the core does not model (chunk handles, transfer pins):

* every resident key has one *owner location* ``(segment, block index)`` in the core's
  :class:`~tenure.service.policy.tier.HostTier`; the index comes from the key's token position, so a
  session's context maps to a few long runs and the core's cost grows with sessions, not blocks;
* keys reused by other sessions (shared prefixes) are reference-counted: when the owner's blocks
  are reclaimed (last turn, host TTL) a live sharer inherits them instead of losing them;
* invariant: every key in :attr:`chunks` is either resident in the tier or *doomed* (the core
  dropped it, vLLM still holds the chunk because a transfer pins it, or no manager can free it
  yet); staged keys are admitted by the core and about to be inserted by vLLM.

A store is decided once, for the whole offer, before vLLM asks for victims:
:meth:`begin_store` (called by :class:`~tenure.engine_adapter.manager.TenureOffloadingManager`, or
by ``on_store_miss`` under vLLM's stock manager) runs the core's gate; ``evict`` then hands vLLM the
chosen victims, or ``None`` to refuse the store. Everything runs on EngineCore's scheduler
thread; the push-channel thread only appends to :attr:`inbox`.

The class is assembled from parts with one job each (see :mod:`tenure.engine_adapter.policy_state`):
the key map, pushed decisions and timers, requests and session inference, the store gate, and
the stock-manager path; what stays here is the ``CachePolicy`` surface that is none of those.
The per-offer loops (``begin_store``, ``on_request_finished``, ``evict``) keep the map's
lookups inlined as locals instead of calling the key map's methods: they run for every block of
every offer on the scheduler thread, where a Python call per block is most of their cost
(``tenure bench policy``).

No clock is read inside a decision: ``clock`` (monotonic, the core's time) and ``wall_clock``
(Unix seconds, to convert pushed decisions' absolute times) are passed in.
"""

from __future__ import annotations

import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus, order_request_keys

from tenure.engine_adapter.key_map import merge_locs
from tenure.engine_adapter.policy_state import Loc
from tenure.engine_adapter.rent_timers import RentTimers
from tenure.engine_adapter.resumes import ResumeTracker
from tenure.engine_adapter.stock_path import StockPath
from tenure.engine_adapter.vllm_compat import core_params
from tenure.service.policy import EvictionClass, HostTier, Run, SessionHint, create_policy
from tenure.service.wire.push import Decision, Snapshot

__all__ = ["TenureCachePolicy"]


class TenureCachePolicy(StockPath):
    """A ``CachePolicy`` whose decisions come from a core policy (``core_name``)."""

    #: Core policy name; the plugin registers one subclass per core policy.
    core_name: ClassVar[str] = "tenure"

    def __init__(
        self,
        cache_capacity: int,
        req_context: Any = None,
        *,
        core_params: dict[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(cache_capacity)
        del req_context  # signature symmetry with 0.33's insert; unused here
        self._clock = clock
        self._wall_clock = wall_clock
        self._core_params = core_params
        #: Set by the manager that can free chunks on its own (reclaim, TTL, pushed decisions).
        self.can_release = False
        #: Tokens per offloaded block; 0 = learn it from key positions (stock manager).
        self.block_tokens = 0
        #: Push channel -> engine thread: Decisions and Snapshots (appended by another thread).
        self.inbox: deque[Decision | Snapshot] = deque()
        self.stats: Counter[str] = Counter()
        #: Bumped by every ``clear()``, like vLLM's manager's cache generation.
        self.generation = 0
        #: Resumed requests classified by where their prompt came from (reported upstream).
        self.resumes = ResumeTracker()
        #: Tenants' rent clocks and the held copies they re-price (pushed decisions).
        self.rent_timers = RentTimers()
        #: Tenant -> the host-retention branch of the sidecar's last snapshot.
        self.retention_branches: dict[str, str] = {}
        self._reset_state()

    def _reset_state(self) -> None:
        # Per-request state made before this point belongs to the old tier: a fresh token
        # makes every ReqContext's cached _RequestInfo stale (one identity check per call).
        self._epoch = object()
        self.core = create_policy(self.core_name, core_params(self.core_name, self._core_params))
        self.tier = HostTier(self.core, self.cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        # vLLM calls get() once per looked-up block: bind the dict's own method (no Python frame).
        self.get = self.chunks.get  # type: ignore[method-assign, assignment]
        self._loc: dict[OffloadKey, Loc] = {}
        self._key_at: list[list[OffloadKey | None]] = []
        self._frontier: list[int] = []
        #: Base segment -> its fork segments (context edits, same-position KV groups).
        self._forks: dict[int, list[int]] = {}
        self._fork_serial = 0
        self._pinned: set[OffloadKey] = set()
        self._doomed: dict[OffloadKey, EvictionClass] = {}
        self._staged: set[OffloadKey] = set()
        self._staged_victims: list[tuple[OffloadKey, EvictionClass]] | None = None
        #: Under vLLM's stock manager: the misses of an offer not decided yet (``on_store_miss``
        #: only sees the new misses; ``evict`` sees the whole offer, ``insert`` a store that
        #: needs no room), with the storing request.
        self._stash: tuple[list[OffloadKey], ReqContext] | None = None
        #: Stock manager: recent requests' reported misses (key -> order), to find the request
        #: and the store behind a bare evict() when vLLM did not report (a retried offer).
        self._misses: OrderedDict[int, tuple[ReqContext, dict[OffloadKey, None]]] = OrderedDict()
        self._refused = False
        self._offer_blocks = 0
        self._polls = 0
        self._released: list[tuple[OffloadKey, ChunkStatus]] = []
        self._sharers: dict[OffloadKey, dict[str, Loc]] = {}
        self._ended: set[str] = set()
        #: Sessions that sent a request to this engine: with several engines behind a router
        #: every adapter receives every decision and applies only those of sessions it holds.
        self._held: set[str] = set()
        self._applied_seq: dict[str, int] = {}
        self._last_hint: dict[str, SessionHint] = {}
        self._last_ctx: ReqContext | None = None
        self._next_due = math.inf
        self.last_applied_seq = -1
        self._request_serial = 0

    def configure(self, core_params: dict[str, float]) -> None:
        """Rebuild the (still empty) core with explicit parameters; bad names raise."""
        if self.chunks:
            raise RuntimeError("configure() must run before the first store")
        self._core_params = dict(core_params)
        self._reset_state()

    @property
    def sessions_tracked(self) -> int:
        return sum(1 for _ in self.tier.resident_sessions())

    def resident_blocks(self, session: str) -> int:
        """Blocks of ``session`` resident in the host tier (what tests and reports read)."""
        return self.tier.session_resident.get(session, 0)

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def remove(self, key: OffloadKey) -> None:
        self.chunks.pop(key, None)
        self._pinned.discard(key)
        self._doomed.pop(key, None)
        self._sharers.pop(key, None)
        if key in self._loc:
            run = self._run_of(key)
            self._unplace(key)
            self.tier.drop([run])

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """A direct recency signal (vLLM's tiering manager sends it; 0.32's scheduler never does).

        Passed to the core as runs in the order given; the recency cores (``lru``,
        ``lru-reclaim``, ``arc``) apply it as vLLM's LRU / ARC do, the lifecycle policies ignore
        it (a touch is neither a request start nor a finish). Keys vLLM does not hold, or holds
        only as doomed, are not in the tier and are skipped (vLLM's LRU skips unheld keys too;
        ARC's ghost-hit adaptation on a touch of an unheld key is not mirrored).
        """
        now = self._clock()
        if self._staged or self._stash is not None:
            self._unstage(now)
        chunks, loc_of = self.chunks, self._loc.get
        locs: list[Loc] = []
        pending: list[Loc] = []
        for key in keys:
            chunk = chunks.get(key)
            loc = loc_of(key) if chunk is not None else None
            if loc is None or chunk is None:
                continue
            locs.append(loc)
            if chunk.ref_cnt < 0:
                pending.append(loc)
        if locs:
            self.tier.touch(merge_locs(locs), now, pending=merge_locs(sorted(pending)))

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.33: the request used ``keys`` (a load, or the held part of a store) before
        finishing; policies with request-scoped ranks (its LRU) order them now."""
        now = self._clock()
        info = self._request(req_context, now, infer=False)
        loc_of = self._loc.get
        locs = sorted(loc for k in keys if (loc := loc_of(k)) is not None)
        self.tier.request_access(info.serial, merge_locs(locs), now)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: set[OffloadKey],
        reused_keys: set[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        now = self._clock()
        if self._staged or self._stash is not None:
            self._unstage(now)  # a stock-manager offer vLLM dropped: over by now
        if self._misses:
            self._misses.pop(id(req_context), None)
        info = self._request(req_context, now)
        session = info.session
        assert session is not None
        keys = order_request_keys(key_groups, req_context)
        loc_of = self._loc.get
        owner_of = self.tier.owner
        runs: list[Run] = []
        seg = start = stop = -1
        foreign = False
        for key in keys:
            loc = loc_of(key)
            if loc is None:
                continue
            if loc[0] == seg and loc[1] == stop:
                stop += 1
            else:
                if seg >= 0:
                    runs.append(Run(seg, start, stop))
                if loc[0] != seg:
                    foreign = owner_of(loc[0]) != session
                seg, start, stop = loc[0], loc[1], loc[1] + 1
            if foreign:
                # A shared prefix: remember where it sits in this session's context, so the
                # session can inherit it when the owner's blocks are reclaimed.
                sharers = self._sharers.setdefault(key, {})
                if session not in sharers:
                    sharers[session] = (info.seg, self._index(key, req_context, info))
        if seg >= 0:
            runs.append(Run(seg, start, stop))
        inserted: list[Run] = []
        if insertion_only_keys:
            inserted = merge_locs(
                [loc for k in keys if k in insertion_only_keys and (loc := loc_of(k))]
            )
        victims = self.tier.access(runs, now, session=session, inserted=inserted)
        if info.tags.last_turn:
            self._ended.add(session)
        self._drop_victims(victims, now)
        self._refresh_timer()

    def clear(self) -> None:
        inbox, stats = self.inbox, self.stats
        self.generation += 1
        self._reset_state()
        self.inbox, self.stats = inbox, stats

    def mark_evictable(self, key: OffloadKey) -> None:
        self._pinned.discard(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._pinned.add(key)
