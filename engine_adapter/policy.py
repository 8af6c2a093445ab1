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
:meth:`StoreGate.begin_store <tenure.engine_adapter.store_gate.StoreGate.begin_store>` (called on
:attr:`gate` by :class:`~tenure.engine_adapter.manager.TenureOffloadingManager`, or by
``on_store_miss`` under vLLM's stock manager) runs the core's gate; ``evict`` then hands vLLM the
chosen victims, or ``None`` to refuse the store. Everything runs on EngineCore's scheduler
thread; the push-channel thread only appends to :attr:`inbox`.

The policy is composed of parts with one job each, each owning its fields, built in
:meth:`TenureCachePolicy._build` and passed to each other (no part knows the ones above it):

* :class:`~tenure.engine_adapter.key_map.KeyMap`: the key <-> (segment, index) map;
* :class:`~tenure.engine_adapter.sessions.Sessions`: the per-session tables the parts share;
* :class:`~tenure.engine_adapter.holdings.Holdings`: vLLM's chunks (pinned, doomed, staged, shared);
* :class:`~tenure.engine_adapter.pushed.Pushed`: the sidecar's decisions and the core's timers;
* :class:`~tenure.engine_adapter.requests.Requests`: request starts and session inference;
* :class:`~tenure.engine_adapter.store_gate.StoreGate`: one decision per offer;
* :class:`~tenure.engine_adapter.stock_path.StockPath`: vLLM's stock-manager calls.

What stays here is the ``CachePolicy`` surface that composes them. The per-offer loops
(the gate's ``begin_store``, ``on_request_finished``, ``evict``) bind the map's tables to locals
instead of calling the key map's methods: they run for every block of every offer on the
scheduler thread, where a Python call per block is most of their cost (``tenure bench policy``);
vLLM's per-block calls (``get``, ``insert``) are bound to the part's own method on the
instance, so they cost no extra frame for the composition.

No clock is read inside a decision: ``clock`` (monotonic, the core's time) and ``wall_clock``
(Unix seconds, to convert pushed decisions' absolute times) are passed in.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from tenure.engine_adapter.holdings import Holdings
from tenure.engine_adapter.key_map import KeyMap, Loc, merge_locs
from tenure.engine_adapter.pushed import Pushed
from tenure.engine_adapter.rent_timers import RentTimers
from tenure.engine_adapter.requests import Requests
from tenure.engine_adapter.resumes import ResumeTracker
from tenure.engine_adapter.sessions import Sessions
from tenure.engine_adapter.stock_path import StockPath
from tenure.engine_adapter.store_gate import StoreGate
from tenure.engine_adapter.vllm_compat import core_params
from tenure.service.policy import HostTier, Run, TierPolicy, create_policy
from tenure.service.wire.push import Decision, Snapshot

__all__ = ["TenureCachePolicy"]


class TenureCachePolicy(CachePolicy):
    """A ``CachePolicy`` whose decisions come from a core policy (``core_name``)."""

    #: Core policy name; the plugin registers one subclass per core policy.
    core_name: ClassVar[str] = "tenure"

    core: TierPolicy
    tier: HostTier
    key_map: KeyMap
    sessions: Sessions
    holdings: Holdings
    pushed: Pushed
    requests: Requests
    gate: StoreGate
    stock_path: StockPath
    #: vLLM's chunks by key (:attr:`Holdings.chunks`, the same dict).
    chunks: dict[OffloadKey, ChunkStatus]

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
        # What outlives a clear() (vLLM's reset_cache): the push channel's inbox, the counters
        # the sidecar reads, the resume reports, the tenants' rent clocks.
        #: Push channel -> engine thread: Decisions and Snapshots (appended by another thread).
        self.inbox: deque[Decision | Snapshot] = deque()
        self.stats: Counter[str] = Counter()
        #: Bumped by every ``clear()``, like vLLM's manager's cache generation.
        self.generation = 0
        #: Resumed requests classified by where their prompt came from (reported upstream).
        self.resumes = ResumeTracker()
        #: Tenants' rent clocks and the held copies they re-price (pushed decisions).
        self.rent_timers = RentTimers()
        self._build(block_tokens=0, can_release=False, reports_lookups=False, retention_branches={})

    def _build(
        self,
        *,
        block_tokens: int,
        can_release: bool,
        reports_lookups: bool,
        retention_branches: dict[str, str],
    ) -> None:
        """Build the core and the parts over it (at start, and again on every ``clear()``)."""
        self.core = create_policy(self.core_name, core_params(self.core_name, self._core_params))
        self.tier = HostTier(self.core, self.cache_capacity)
        self.key_map = KeyMap(self.tier, block_tokens)
        self.sessions = Sessions()
        self.holdings = Holdings(self.key_map, self.sessions, self.stats, can_release=can_release)
        self.pushed = Pushed(
            core=self.core,
            holdings=self.holdings,
            sessions=self.sessions,
            stats=self.stats,
            inbox=self.inbox,
            resumes=self.resumes,
            rent_timers=self.rent_timers,
            clock=self._clock,
            wall_clock=self._wall_clock,
            retention_branches=retention_branches,
        )
        self.requests = Requests(
            holdings=self.holdings,
            sessions=self.sessions,
            pushed=self.pushed,
            stats=self.stats,
            resumes=self.resumes,
        )
        self.requests.reports_lookups = reports_lookups
        self.gate = StoreGate(
            holdings=self.holdings, requests=self.requests, stats=self.stats, clock=self._clock
        )
        self.stock_path = StockPath(self.gate, self.cache_capacity)
        self.chunks = self.holdings.chunks
        # vLLM calls get(), insert() and mark_evictable() once per block and poll() once per
        # step (the manager calls the store protocol on ``gate`` itself): each is bound here to
        # the part's own method (or the container's), so the composition costs them no extra
        # Python frame.
        # The methods below say the same for readers and for vLLM's ABC.
        self.get = self.chunks.get  # type: ignore[method-assign, assignment]
        self.insert = self.stock_path.insert  # type: ignore[method-assign]
        self.mark_evictable = self.holdings.pinned.discard  # type: ignore[method-assign, assignment]
        self.mark_non_evictable = self.holdings.pinned.add  # type: ignore[method-assign, assignment]
        self.on_store_miss = self.stock_path.on_store_miss  # type: ignore[method-assign]
        self.poll = self.pushed.poll  # type: ignore[method-assign]
        self.take_released = self.holdings.take_released  # type: ignore[method-assign]

    def _rebuild(self) -> None:
        self._build(
            block_tokens=self.key_map.block_tokens,
            can_release=self.holdings.can_release,
            reports_lookups=self.requests.reports_lookups,
            retention_branches=self.pushed.retention_branches,
        )

    def set_clocks(self, clock: Callable[[], float], wall_clock: Callable[[], float]) -> None:
        """Replace the clocks (tests that drive time by hand); the parts read them from now."""
        self._clock, self._wall_clock = clock, wall_clock
        self.pushed.clock, self.pushed.wall_clock = clock, wall_clock
        self.gate.clock = clock

    def configure(self, core_params: dict[str, float]) -> None:
        """Rebuild the (still empty) core with explicit parameters; bad names raise."""
        if self.chunks:
            raise RuntimeError("configure() must run before the first store")
        self._core_params = dict(core_params)
        self._rebuild()

    @property
    def block_tokens(self) -> int:
        """Tokens per offloaded block; 0 = learn it from key positions (stock manager)."""
        return self.key_map.block_tokens

    @block_tokens.setter
    def block_tokens(self, value: int) -> None:
        self.key_map.block_tokens = value

    @property
    def can_release(self) -> bool:
        """Set by the manager that can free chunks on its own (reclaim, TTL, pushed decisions)."""
        return self.holdings.can_release

    @can_release.setter
    def can_release(self, value: bool) -> None:
        self.holdings.can_release = value

    @property
    def last_applied_seq(self) -> int:
        """The newest pushed sequence number applied (reported to the sidecar)."""
        return self.pushed.last_applied_seq

    @property
    def sessions_tracked(self) -> int:
        return sum(1 for _ in self.tier.resident_sessions())

    def resident_blocks(self, session: str) -> int:
        """Blocks of ``session`` resident in the host tier (what tests and reports read)."""
        return self.tier.session_resident.get(session, 0)

    # vLLM's CachePolicy ------------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: Any = None) -> None:
        # vLLM 0.32 calls insert(key, chunk); 0.33 adds the request context.
        self.stock_path.insert(key, chunk, req_context)

    def remove(self, key: OffloadKey) -> None:
        self.holdings.remove(key)

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        self.stock_path.on_store_miss(keys, req_context)

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        return self.gate.evict(n, protected, self.stock_path.stashed_offer)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """A direct recency signal (vLLM's tiering manager sends it; 0.32's scheduler never does).

        Passed to the core as runs in the order given; the recency cores (``lru``,
        ``lru-reclaim``, ``arc``) apply it as vLLM's LRU / ARC do, the lifecycle policies ignore
        it (a touch is neither a request start nor a finish). Keys vLLM does not hold, or holds
        only as doomed, are not in the tier and are skipped (vLLM's LRU skips unheld keys too;
        ARC's ghost-hit adaptation on a touch of an unheld key is not mirrored).
        """
        now = self._clock()
        gate = self.gate
        if self.holdings.staged or gate.pending is not None:
            gate.unstage(now)
        chunks, loc_of = self.chunks, self.key_map.loc.get
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

    def request_loads(self, keys: int, req_context: ReqContext) -> None:
        """Tenure's manager prepares a load of ``keys`` blocks for the request: the engine
        admitted it. Called before vLLM's own ``prepare_load``, which in 0.33 reports the
        access (:meth:`on_request_access`) and so the admission, with the host hit known."""
        now = self._clock()
        requests = self.requests
        requests.admit(requests.loading(keys, req_context, now), req_context, now)

    def request_computes(self, req_context: ReqContext) -> None:
        """The request computes blocks whose store vLLM cannot make (transfers pin the room):
        the engine admitted it all the same."""
        now = self._clock()
        requests = self.requests
        requests.admit(requests.request(req_context, now), req_context, now)

    def on_request_access(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        """vLLM 0.33: the request used ``keys`` (a load, or the held part of a store) before
        finishing; policies with request-scoped ranks (its LRU) order them now."""
        now = self._clock()
        info = self.requests.request(req_context, now, infer=False)
        self.requests.admit(info, req_context, now)  # it loads or stores: the engine runs it
        loc_of = self.key_map.loc.get
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
        gate, holdings, key_map = self.gate, self.holdings, self.key_map
        if holdings.staged or gate.pending is not None:
            gate.unstage(now)  # a stock-manager offer vLLM dropped: over by now
        misses = self.stock_path.misses
        if misses:
            misses.pop(id(req_context), None)
        info = self.requests.request(req_context, now)
        session = info.session
        assert session is not None
        keys = order_request_keys(key_groups, req_context)
        loc_of = key_map.loc.get
        owner_of = self.tier.owner
        all_sharers = holdings.sharers
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
                sharers = all_sharers.setdefault(key, {})
                if session not in sharers:
                    sharers[session] = (info.seg, key_map.index(key, req_context, info.next_index))
        if seg >= 0:
            runs.append(Run(seg, start, stop))
        inserted: list[Run] = []
        if insertion_only_keys:
            inserted = merge_locs(
                [loc for k in keys if k in insertion_only_keys and (loc := loc_of(k))]
            )
        victims = self.tier.access(runs, now, session=session, inserted=inserted)
        if info.tags.last_turn:
            self.sessions.ended.add(session)
        holdings.drop_victims(victims, now)
        self.pushed.refresh_timer()

    def clear(self) -> None:
        self.generation += 1
        self._rebuild()

    def mark_evictable(self, key: OffloadKey) -> None:
        self.holdings.pinned.discard(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self.holdings.pinned.add(key)

    # Tenure's manager and the push channel ----------------------------------------------

    def on_new_request(self, ctx: ReqContext, now: float | None = None) -> None:
        """A request reached the scheduler: its session is active from now."""
        self.requests.on_new_request(ctx, self._clock() if now is None else now)

    def poll(self, now: float | None = None) -> None:
        """Apply pushed decisions and fire due timers (engine thread, once per step)."""
        self.pushed.poll(now)

    def has_work(self, now: float) -> bool:
        return self.pushed.has_work(now)

    def pending_timer(self) -> float:
        """When the core next has due work (monotonic seconds; ``inf`` = none)."""
        return self.pushed.pending_timer()

    def take_released(self) -> list[tuple[OffloadKey, ChunkStatus]]:
        """Chunks this policy dropped outside ``evict``; the manager returns them to its pool."""
        return self.holdings.take_released()
