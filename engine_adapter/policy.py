"""Tenure's decision core behind vLLM's ``CachePolicy``: block keys in, session decisions out.

vLLM's offloading manager speaks in block keys (chained prefix hashes); the core speaks in
sessions and segments (runs of blocks). This class keeps the map between the two and the
vLLM-side facts the core does not model (chunk handles, transfer pins):

* every resident key has one *owner location* ``(segment, block index)`` in the core's
  :class:`~service.policy.tier.HostTier`; the index comes from the key's token position, so a
  session's context maps to a few long runs and the core's cost grows with sessions, not blocks;
* keys reused by other sessions (shared prefixes) are reference-counted: when the owner's blocks
  are reclaimed (last turn, host TTL) a live sharer inherits them instead of losing them;
* invariant: every key in :attr:`chunks` is either resident in the tier or *doomed* (the core
  dropped it, vLLM still holds the chunk because a transfer pins it, or no manager can free it
  yet); staged keys are admitted by the core and about to be inserted by vLLM.

A store is decided once, for the whole offer, before vLLM asks for victims:
:meth:`begin_store` (called by :class:`~engine_adapter.manager.TenureOffloadingManager`, or by
``on_store_miss`` under vLLM's stock manager) runs the core's gate; ``evict`` then hands vLLM the
chosen victims, or ``None`` to refuse the store. Everything runs on EngineCore's scheduler
thread; the push-channel thread only appends to :attr:`inbox`.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys

from engine_adapter.resumes import ResumeTracker
from engine_adapter.tags import RequestTags, parse_tags
from service.policy import EvictionClass, HostTier, Run, SessionHint, Victim, create_policy
from service.push.messages import Decision, Snapshot

__all__ = ["TenureCachePolicy"]

log = logging.getLogger("vllm.tenure")

_Loc = tuple[int, int]
#: Per-session tables above this size drop sessions with nothing resident (checked every
#: 1024 polls, i.e. engine steps).
_PRUNE_ABOVE = 20_000
#: Requests whose reported store misses the stock-manager path remembers.
_RECENT_REQUESTS = 256


@dataclass(slots=True)
class _RequestInfo:
    """Per-request state, cached in the request's ``ReqContext``.

    ``owner`` is the policy's generation token: a ``clear()`` (vLLM's ``reset_cache``) makes a
    new one, so state cached before it (segment ids of the old tier) is never trusted after.
    """

    owner: object
    tags: RequestTags
    session: str | None
    seg: int = -1
    next_index: int = 0
    started: bool = False
    inserted: list[OffloadKey] = field(default_factory=list)


class TenureCachePolicy(CachePolicy):
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
    ) -> None:
        super().__init__(cache_capacity)
        del req_context  # signature symmetry with 0.33's insert; unused here
        self._clock = clock
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
        #: Tenant -> the host-retention branch of the sidecar's last snapshot.
        self.retention_branches: dict[str, str] = {}
        self._reset_state()

    # --- state --------------------------------------------------------------------------------

    def _reset_state(self) -> None:
        # Per-request state made before this point belongs to the old tier: a fresh token
        # makes every ReqContext's cached _RequestInfo stale (one identity check per call).
        self._epoch = object()
        self.core = create_policy(self.core_name, self._core_params)
        self.tier = HostTier(self.core, self.cache_capacity)
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        # vLLM calls get() once per looked-up block: bind the dict's own method (no Python frame).
        self.get = self.chunks.get  # type: ignore[method-assign, assignment]
        self._loc: dict[OffloadKey, _Loc] = {}
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
        self._sharers: dict[OffloadKey, dict[str, _Loc]] = {}
        self._ended: set[str] = set()
        #: Sessions that sent a request to this engine: with several engines behind a router
        #: every adapter receives every decision and applies only those of sessions it holds.
        self._held: set[str] = set()
        self._applied_seq: dict[str, int] = {}
        self._last_hint: dict[str, SessionHint] = {}
        self._last_ctx: ReqContext | None = None
        self._next_due = math.inf
        self.last_applied_seq = -1

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

    # --- segments and positions -----------------------------------------------------------

    def _segment(self, session: str, name: Any) -> int:
        seg = self.tier.segment((session, name), session)
        while len(self._key_at) <= seg:
            self._key_at.append([])
            self._frontier.append(0)
        return seg

    def _index(self, key: OffloadKey, ctx: ReqContext | None, info: _RequestInfo) -> int:
        pos = ctx.get_offload_key_position(key) if ctx is not None else None
        if pos is None or pos <= 0:
            return info.next_index
        if self.block_tokens <= 0 or pos % self.block_tokens:
            # Learn the block size (vLLM's stock manager does not say it): the gcd of every
            # position the request has, not just this key's, so a request whose tail is
            # offered first does not set it to a multiple of the block.
            unit = max(self.block_tokens, 0)
            for p in ctx._offload_key_positions.values() if ctx is not None else (pos,):
                unit = math.gcd(unit, p)
            self.block_tokens = math.gcd(unit, pos)
        return pos // self.block_tokens - 1

    def _occupant(self, seg: int, index: int) -> OffloadKey | None:
        slots = self._key_at[seg]
        return slots[index] if index < len(slots) else None

    def _place(self, key: OffloadKey, loc: _Loc) -> None:
        seg, index = loc
        slots = self._key_at[seg]
        if len(slots) <= index:
            slots.extend([None] * (index + 1 - len(slots)))
        slots[index] = key
        self._loc[key] = loc
        if index + 1 > self._frontier[seg]:
            self._frontier[seg] = index + 1

    def _unplace(self, key: OffloadKey) -> _Loc | None:
        loc = self._loc.pop(key, None)
        if loc is not None:
            self._key_at[loc[0]][loc[1]] = None
        return loc

    # --- requests -------------------------------------------------------------------------

    def _request(self, ctx: ReqContext | None, now: float, *, infer: bool = True) -> _RequestInfo:
        if ctx is None:
            ctx = self._last_ctx
        info = ctx.get_state(_RequestInfo) if ctx is not None else None
        if info is None or info.owner is not self._epoch:
            tags = parse_tags(ctx.kv_transfer_params if ctx is not None else None)
            if tags.invalid:
                self.stats["invalid_tags"] += tags.invalid
            info = _RequestInfo(owner=self._epoch, tags=tags, session=tags.session_id)
            if ctx is not None:
                ctx.set_state(info)
        if info.session is None:
            if not infer:
                # Untagged: the prefix chain is known only once vLLM has hashed the request's
                # blocks (after on_new_request); the session is inferred at its first store.
                return info
            info.session = self._infer_session(ctx)
        if not info.started:
            self._start(info, now)
        return info

    def _infer_session(self, ctx: ReqContext | None) -> str:
        """Prefix-chain inference for untagged requests.

        The request continues a session when the deepest of its keys that is resident here is
        that session's frontier block (its newest); a prefix shared only partly (a common
        system prompt) starts a new anonymous session instead.
        """
        positions: dict[OffloadKey, int] | None = getattr(ctx, "_offload_key_positions", None)
        if positions:
            deepest: _Loc | None = None
            for key in positions:
                loc = self._loc.get(key)
                if loc is not None and (deepest is None or loc[1] >= deepest[1]):
                    deepest = loc
            if deepest is not None and deepest[1] + 1 == self._frontier[deepest[0]]:
                return self.tier.owner(deepest[0])
        self.stats["untagged_requests"] += 1
        return f"anon-{ctx.req_id if ctx is not None else self.stats['untagged_requests']}"

    def _start(self, info: _RequestInfo, now: float) -> None:
        session = info.session
        assert session is not None
        info.started = True
        if session not in self._held:
            self._held.add(session)
            if info.tags.turn > 1:
                # Earlier turns ran elsewhere (a router moved the session, or this engine
                # restarted): its KV is cold here. The sidecar counts these as moves.
                self.stats["cold_sessions"] += 1
        info.seg = self._segment(session, info.tags.segment)
        self.tier.request_start(session, now)
        self._ended.discard(session)
        tags = info.tags
        if tags.expected_gap_s is not None or tags.last_turn or tags.suspended:
            hint = SessionHint(
                expected_gap_s=tags.expected_gap_s,
                last_turn=tags.last_turn,
                suspended=tags.suspended,
            )
            # Most turns repeat the session's previous hint: telling the core again changes
            # nothing for an active session, so skip it. A last turn is always told (the core
            # clears the declaration once it reclaims).
            if hint.last_turn or self._last_hint.get(session) != hint:
                if hint.last_turn:
                    self._last_hint.pop(session, None)
                else:
                    self._last_hint[session] = hint
                self._drop_victims(self.tier.hint(session, hint, now), now)
        self._refresh_timer()

    def on_new_request(self, ctx: ReqContext, now: float | None = None) -> None:
        """A request reached the scheduler: its session is active from now."""
        info = self._request(ctx, self._clock() if now is None else now, infer=False)
        self.resumes.start(info.session, ctx)

    # --- the store gate -------------------------------------------------------------------

    def begin_store(
        self,
        offer: Sequence[OffloadKey],
        ctx: ReqContext | None,
        now: float | None = None,
        *,
        reported: Collection[OffloadKey] | None = None,
    ) -> bool:
        """Decide an offer (the keys vLLM is about to store) before vLLM evicts for it.

        ``offer`` is the whole offer as vLLM's ``prepare_store`` sees it: the keys it already
        holds are not stored again but are *protected* (vLLM never evicts a key of the offer),
        so the core is told about them and never picks them as victims. ``reported``: the
        misses this request already reported to vLLM's manager (it tells a policy of each miss
        once; ARC learns from them). Returns whether the core admitted the store. On admission
        the missing keys are staged (the tier counts them resident) and the victims are held
        for ``evict``.
        """
        now = self._clock() if now is None else now
        self._unstage(now)
        if ctx is not None:
            self._last_ctx = ctx
        info = self._request(ctx, now)
        session = info.session
        assert session is not None
        # Two passes: plan the offer's (key, segment, index) placements without touching the
        # maps, ask the gate, and write them only if it admits. Under overload most offers are
        # refused, and a refusal then costs no writes to undo.
        runs: list[Run] = []
        planned: list[tuple[OffloadKey, int, int]] = []
        held: list[_Loc] = []
        run_seg = run_start = run_stop = -1
        chunks, staged = self.chunks, self._staged
        key_at, loc_map = self._key_at, self._loc
        positions: dict[OffloadKey, int] = getattr(ctx, "_offload_key_positions", None) or {}
        unit = self.block_tokens
        seg = info.seg
        slots = key_at[seg]
        fallback = info.next_index  # keys without a known position follow the previous one
        taken: dict[int, OffloadKey] = {}  # indices this offer claims in ``seg``
        for key in offer:
            if key in chunks or key in staged:
                loc = loc_map.get(key)
                if loc is not None:  # held: protected, not stored again
                    held.append(loc)
                continue
            pos = positions.get(key)
            if pos and unit and pos % unit == 0:
                index = pos // unit - 1
            elif pos and pos > 0:
                index = self._index(key, ctx, info)
                unit = self.block_tokens
            else:
                index = fallback
            other = taken.get(index)
            if other is None and index < len(slots):
                other = slots[index]
            if other is not None and other != key:
                # Same session, same position, different content (an edited or branched
                # context, or another KV group): continue in a segment whose slot is free, so
                # residency stays one key per slot.
                seg = self._fork(session, info, seg, index, planned)
                info.seg = seg
                slots = key_at[seg]
                taken = {i: k for k, s, i in planned if s == seg}
            taken[index] = key
            fallback = index + 1
            planned.append((key, seg, index))
            if seg == run_seg and index == run_stop:
                run_stop += 1
            else:
                if run_seg >= 0:
                    runs.append(Run(run_seg, run_start, run_stop))
                run_seg, run_start, run_stop = seg, index, index + 1
        if not planned:
            return True
        n_new = len(planned)
        runs.append(Run(run_seg, run_start, run_stop))
        info.next_index = run_stop
        protected = runs
        capacity = self.tier.capacity
        if capacity is not None and n_new > capacity - self.tier.used:
            # Victims will be chosen: what vLLM will not let go must be off limits to the core.
            if held:
                protected = protected + _merge(sorted(held))
            if self._pinned:
                protected = protected + self._pinned_runs()
        misses = None
        if reported:
            misses = _merge([(s, i) for k, s, i in planned if k not in reported])
        result = self.tier.store(protected, session, now, misses=misses)
        if not result.admitted:
            self._refused = True
            self.stats["refusals"] += 1
            self.stats["refused_blocks"] += n_new
            return False
        frontier = self._frontier
        for key, seg, index in planned:
            slots = key_at[seg]
            if len(slots) <= index:
                slots.extend([None] * (index + 1 - len(slots)))
            slots[index] = key
            loc_map[key] = (seg, index)
            if index >= frontier[seg]:
                frontier[seg] = index + 1
            staged.add(key)
        # Counted when vLLM has inserted them (end_store): it may still drop the store.
        self._offer_blocks = n_new
        staged_victims: list[tuple[OffloadKey, EvictionClass]] = []
        for victim in result.victims:
            staged_victims.extend(_victim_keys(key_at, victim))
        self._staged_victims = staged_victims
        return True

    def report_misses(self, keys: Sequence[OffloadKey], ctx: ReqContext | None) -> None:
        """vLLM reported store misses for a store it then could not make (no evictable room):
        the core learns from them as from the misses of a store (ARC adapts to ghost hits).
        Keys are located where the store would have put them; a slot held by other content
        (an edit: the store would fork) has no history to learn from and is skipped."""
        now = self._clock()
        info = self._request(ctx, now)
        positions: dict[OffloadKey, int] = getattr(ctx, "_offload_key_positions", None) or {}
        unit = self.block_tokens
        locs: list[_Loc] = []
        index = info.next_index
        for key in keys:
            pos = positions.get(key)
            if pos and unit and pos % unit == 0:
                index = pos // unit - 1
            elif pos and pos > 0:
                index = self._index(key, ctx, info)
                unit = self.block_tokens
            if self._occupant(info.seg, index) is None:
                locs.append((info.seg, index))
            index += 1
        self.tier.report_misses(_merge(locs), now)

    def _fork(
        self,
        session: str,
        info: _RequestInfo,
        current: int,
        index: int,
        planned: Sequence[tuple[OffloadKey, int, int]],
    ) -> int:
        """A segment of ``info``'s context whose slot ``index`` is free (a new fork if none)."""
        base = self._segment(session, info.tags.segment)
        forks = self._forks.setdefault(base, [])
        claimed = {s for _, s, i in planned if i == index}
        for seg in (base, *forks):
            if seg != current and seg not in claimed and self._occupant(seg, index) is None:
                return seg
        self._fork_serial += 1
        seg = self._segment(session, (info.tags.segment, "fork", self._fork_serial))
        forks.append(seg)
        return seg

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
        return _merge(sorted(locs))

    def _unstage(self, now: float) -> None:
        """Roll back what an offer staged but vLLM never inserted (its store was dropped)."""
        self._stash = None
        staged = self._staged
        leftovers = [k for k in staged if k not in self.chunks] if staged else []
        staged.clear()
        offered, self._offer_blocks = self._offer_blocks, 0
        if offered:
            inserted = offered - len(leftovers)
            if inserted > 0:
                self.stats["stores"] += 1
                self.stats["stored_blocks"] += inserted
            else:
                # Admitted by the gate, dropped by vLLM (no evictable room: transfers pin it).
                self.stats["refusals"] += 1
                self.stats["refused_blocks"] += offered
        if leftovers:
            runs: list[Run] = []
            for key in leftovers:
                # A reclaim may have dropped a staged key's slot already (stock manager).
                loc = self._unplace(key)
                if loc is not None:
                    runs.append(Run(loc[0], loc[1], loc[1] + 1))
            self.tier.drop(runs)
        victims, self._staged_victims = self._staged_victims, None
        self._refused = False
        if victims:
            # The core chose them but vLLM never evicted them: give them back to the tier.
            self._readmit([k for k, _ in victims], now)

    def _doom(self, key: OffloadKey, cls: EvictionClass) -> None:
        """The tier no longer holds ``key`` but vLLM still does: evict it first."""
        self._unplace(key)
        self._doomed[key] = cls

    def _run_of(self, key: OffloadKey) -> Run:
        seg, index = self._loc[key]
        return Run(seg, index, index + 1)

    def _readmit(self, keys: Iterable[OffloadKey], now: float) -> None:
        for key in keys:
            loc = self._loc.get(key)
            if loc is None:
                continue
            if key not in self.chunks:
                self._unplace(key)
                continue
            run = Run(loc[0], loc[1], loc[1] + 1)
            if self.tier.is_resident(loc[0], loc[1]):
                continue
            if not self.tier.store([run], self.tier.owner(loc[0]), now).admitted:
                self._doom(key, EvictionClass.RECENCY)

    def end_store(self, now: float | None = None) -> None:
        """vLLM finished ``prepare_store``: drop whatever the offer staged and did not use."""
        self._unstage(self._clock() if now is None else now)

    # --- CachePolicy ---------------------------------------------------------------------

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: Any = None) -> None:
        # vLLM 0.32 calls insert(key, chunk); 0.33 adds the request context.
        if key not in self._staged and key not in self._loc:
            self._decide_insert(key, req_context)
        self.chunks[key] = chunk
        if chunk.ref_cnt != 0:
            self._pinned.add(key)
        if key in self._staged:
            self._staged.discard(key)
        elif key not in self._loc:
            # Refused, or no slot for it: vLLM holds it anyway, so it is the first to go.
            self._doomed[key] = EvictionClass.RECENCY

    def _decide_insert(self, key: OffloadKey, req_context: Any) -> None:
        """A key vLLM inserts without a decision: a stock-manager store that needed no room
        (no evict call), or a policy driven by hand. Decided now, so the tier accounts for
        every chunk vLLM holds."""
        stash = self._stash
        ctx: ReqContext | None
        if (
            stash is not None
            and key in stash[0]
            and len(stash[0]) <= self.cache_capacity - len(self.chunks)
        ):
            # The misses on_store_miss reported for this store. (One that did not fit the free
            # room needed evict(): if none came, vLLM dropped that store and it is stale.)
            offer, ctx = stash
        else:
            offer = [key]
            ctx = req_context if isinstance(req_context, ReqContext) else self._ctx_for(key)
        if not self.begin_store(offer, ctx):
            self._refused = False  # vLLM stores anyway
        surplus, self._staged_victims = self._staged_victims, None
        for victim, cls in surplus or ():
            self._doom(victim, cls)  # room vLLM did not need: evicted first, later

    def _ctx_for(self, key: OffloadKey) -> ReqContext | None:
        """The most recent request that reported ``key`` or has its position (stock manager)."""
        for ctx, seen in reversed(self._misses.values()):
            if key in seen or key in ctx._offload_key_positions:
                return ctx
        return self._last_ctx

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
        locs: list[_Loc] = []
        pending: list[_Loc] = []
        for key in keys:
            chunk = chunks.get(key)
            loc = loc_of(key) if chunk is not None else None
            if loc is None or chunk is None:
                continue
            locs.append(loc)
            if chunk.ref_cnt < 0:
                pending.append(loc)
        if locs:
            self.tier.touch(_merge(locs), now, pending=_merge(sorted(pending)))

    def on_store_miss(self, keys: Iterable[OffloadKey], req_context: ReqContext) -> None:
        # TenureOffloadingManager has decided the offer already (its keys are staged). Under
        # vLLM's stock manager this call sees only the offer's new misses, and the keys vLLM
        # protects are known at evict(): remember the misses, decide there (or at insert()).
        keys = list(keys)
        staged, chunks = self._staged, self.chunks
        if all(k in staged or k in chunks for k in keys):
            return
        self._stash = (keys, req_context)
        self._last_ctx = req_context
        misses = self._misses
        entry = misses.get(id(req_context))
        if entry is None or entry[0] is not req_context:
            entry = misses[id(req_context)] = (req_context, {})
            if len(misses) > _RECENT_REQUESTS:
                misses.popitem(last=False)
        elif len(misses) > 1:
            misses.move_to_end(id(req_context))
        entry[1].update(dict.fromkeys(keys))  # what vLLM reported, in report order

    def _stashed_offer(
        self, n: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], ReqContext | None]:
        """The whole offer behind ``evict(n, protected)`` under the stock manager, in order,
        and the request making it (``protected`` is the offer; its misses are the store)."""
        stash, self._stash = self._stash, None
        chunks = self.chunks
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
        for candidate in reversed(self._misses.values()):
            seen, where = candidate[1], candidate[0]._offload_key_positions
            if all(k in seen or k in where for k in missing):
                entry = candidate
                break
        ctx = entry[0] if entry is not None else self._last_ctx
        if entry is not None:
            # vLLM stores n + its free chunks of them: with a store threshold, only the misses
            # it reported (the rest did not pass the threshold).
            want = n + self.cache_capacity - len(chunks)
            if len(missing) > want:
                narrowed = [k for k in missing if k in entry[1]]
                if len(narrowed) == want:
                    missing = narrowed
        # vLLM inserts in offer order: the scheduler offers KV group by group, each in prefix
        # order; without positions, the order the misses were reported in.
        positions = ctx._offload_key_positions if ctx is not None else {}
        if missing and all(k in positions for k in missing):
            missing.sort(key=lambda k: (k[-4:], positions[k]))
        elif entry is not None and missing and all(k in entry[1] for k in missing):
            order = {k: i for i, k in enumerate(entry[1])}
            missing.sort(key=order.__getitem__)
        return missing + held, ctx

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
            inserted = _merge(
                [loc for k in keys if k in insertion_only_keys and (loc := loc_of(k))]
            )
        victims = self.tier.access(runs, now, session=session, inserted=inserted)
        if info.tags.last_turn:
            self._ended.add(session)
        self._drop_victims(victims, now)
        self._refresh_timer()

    def evict(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        if n <= 0:
            return []
        if self._refused:
            self._refused = False
            self._stash = None
            return None
        if self._staged_victims is None:
            # Stock manager: the offer is decided here, where vLLM says what it protects.
            offer, ctx = self._stashed_offer(n, protected)
            if not self.begin_store(offer, ctx):
                self._refused = False
                return None
        chosen = list(self._staged_victims or ())
        self._staged_victims = None
        if len(chosen) > n:
            # The core freed more than vLLM needs (its books counted chunks vLLM still holds):
            # the surplus stays with vLLM as doomed, evicted later.
            for key, cls in chosen[n:]:
                self._doom(key, cls)
            chosen = chosen[:n]
        short = n - len(chosen)
        fills: list[tuple[OffloadKey, EvictionClass]] = []
        if short > 0:
            pinned = self._pinned
            for key, cls in self._doomed.items():
                if key not in pinned and key not in protected:
                    fills.append((key, cls))
                    if len(fills) == short:
                        break
            for key, _ in fills:
                del self._doomed[key]
            short -= len(fills)
        if short > 0:
            # Room the tier does not count (chunks vLLM holds for pinned doomed keys, or a bare
            # evict() with no offer): the core picks that many more victims.
            more = self._make_room(short, protected)
            if more is not None:
                chosen.extend(more)
                short = 0
        if short > 0 or any(k in self._pinned or k in protected for k, _ in chosen):
            # Not enough evictable room (pinned chunks), or the core chose a key vLLM protects:
            # refuse and change nothing vLLM sees. The doomed stay doomed; the core's own
            # victims go back to the tier once the offer's staged keys are rolled back.
            for key, cls in fills:
                self._doomed[key] = cls
            self._staged_victims = chosen
            self._unstage(self._clock())
            self.stats["refusals_pinned"] += 1
            return None
        chosen.extend(fills)
        out: list[tuple[OffloadKey, ChunkStatus]] = []
        doomed, sharers, chunks, loc_map, key_at = (
            self._doomed,
            self._sharers,
            self.chunks,
            self._loc,
            self._key_at,
        )
        by_class: Counter[EvictionClass] = Counter()
        for key, cls in chosen:
            if doomed:
                doomed.pop(key, None)
            loc = loc_map.pop(key, None)
            if loc is not None:
                key_at[loc[0]][loc[1]] = None
            if sharers:
                sharers.pop(key, None)
            out.append((key, chunks.pop(key)))
            by_class[cls] += 1
        for cls, count in by_class.items():
            self.stats[f"evicted_blocks_{cls.value}"] += count
        return out

    def _make_room(
        self, n: int, protected: set[OffloadKey]
    ) -> list[tuple[OffloadKey, EvictionClass]] | None:
        """``n`` victims from the core with nothing stored, or ``None`` (nothing changed)."""
        loc_of = self._loc.get
        locs = [loc for k in protected if (loc := loc_of(k)) is not None]
        locs += [loc for k in self._staged if (loc := loc_of(k)) is not None]
        keep = _merge(sorted(locs))
        if self._pinned:
            keep += self._pinned_runs()
        victims = self.tier.make_room(n, None, keep, self._clock())
        if victims is None:
            return None
        key_at = self._key_at
        out: list[tuple[OffloadKey, EvictionClass]] = []
        for victim in victims:
            out.extend(_victim_keys(key_at, victim))
        return out

    def clear(self) -> None:
        inbox, stats = self.inbox, self.stats
        self.generation += 1
        self._reset_state()
        self.inbox, self.stats = inbox, stats

    def mark_evictable(self, key: OffloadKey) -> None:
        self._pinned.discard(key)

    def mark_non_evictable(self, key: OffloadKey) -> None:
        self._pinned.add(key)

    # --- reclaim, TTL, pushed decisions -----------------------------------------------------

    def _drop_victims(self, victims: Sequence[Victim], now: float) -> None:
        """Blocks the core dropped outside a store (reclaim, TTL): hand them over or doom them."""
        for victim in victims:
            for key in self._keys_of(victim.run):
                owner = self.tier.owner(self._loc[key][0])
                self._unplace(key)
                if key not in self.chunks:
                    # Staged by an offer vLLM never placed (stock manager): nothing to free.
                    self._staged.discard(key)
                    continue
                if victim.cls in (EvictionClass.RECLAIM, EvictionClass.TTL) and self._inherit(
                    key, owner, now
                ):
                    continue
                self._sharers.pop(key, None)
                self._doomed[key] = victim.cls
        if victims and self.can_release:
            self._release_doomed()

    def _inherit(self, key: OffloadKey, owner: str, now: float) -> bool:
        sharers = self._sharers.get(key)
        if not sharers:
            return False
        for session, loc in list(sharers.items()):
            del sharers[session]
            if session == owner or session in self._ended:
                continue
            if self._occupant(*loc) is not None:
                continue
            self._place(key, loc)
            if self.tier.store([Run(loc[0], loc[1], loc[1] + 1)], session, now).admitted:
                self.stats["inherited_blocks"] += 1
                return True
            self._unplace(key)
        return False

    def _release_doomed(self) -> None:
        for key in [k for k in self._doomed if k not in self._pinned]:
            cls = self._doomed.pop(key)
            chunk = self.chunks.pop(key, None)
            if chunk is None:
                continue
            self._sharers.pop(key, None)
            self._released.append((key, chunk))
            self.stats[f"evicted_blocks_{cls.value}"] += 1

    def take_released(self) -> list[tuple[OffloadKey, ChunkStatus]]:
        """Chunks this policy dropped outside ``evict``; the manager returns them to its pool."""
        if self.can_release and self._doomed:
            self._release_doomed()
        out, self._released = self._released, []
        return out

    def _refresh_timer(self) -> None:
        timer = self.core.next_timer()
        self._next_due = math.inf if timer is None else timer

    def pending_timer(self) -> float:
        """When the core next has due work (monotonic seconds; ``inf`` = none)."""
        return self._next_due

    def has_work(self, now: float) -> bool:
        return bool(self.inbox) or now >= self._next_due or bool(self._released)

    def poll(self, now: float | None = None) -> None:
        """Apply pushed decisions and fire due timers (engine thread, once per step)."""
        now = self._clock() if now is None else now
        while self.inbox:
            message = self.inbox.popleft()
            if isinstance(message, Snapshot):
                self.stats["snapshots_applied"] += 1
                self._note_retention(message)
                if message.seq < self.last_applied_seq:
                    # The sidecar's sequence restarted (its state was lost): its snapshot is
                    # the new baseline, whatever numbers we applied before.
                    self._applied_seq.clear()
                for decision in message.decisions:
                    self._apply(decision, now)
                self.last_applied_seq = message.seq
            else:
                self._apply(message, now)
                self.last_applied_seq = max(self.last_applied_seq, message.seq)
        self._polls += 1
        if self._polls % 1024 == 0:
            self._prune()
        if now >= self._next_due:
            before = self.core.counters["ttl_expiries"]
            self._drop_victims(self.tier.expire(now), now)
            self.stats["ttl_expiries"] += self.core.counters["ttl_expiries"] - before
            self._refresh_timer()

    def _note_retention(self, snapshot: Snapshot) -> None:
        """Log a tenant's host-retention branch when the sidecar's controller changes it (each
        suspension's own timer arrives in its decision; this is for the engine's operators)."""
        branches = {t: r.branch for t, r in snapshot.config.retention.items()}
        for tenant, branch in branches.items():
            before = self.retention_branches.get(tenant)
            if before is not None and before != branch:
                self.stats["retention_branch_changes"] += 1
                log.info("tenure: host-retention branch of %s: %s -> %s", tenant, before, branch)
        if len(branches) <= 1024:
            self.retention_branches = branches

    def _prune(self) -> None:
        """Forget per-session bookkeeping of sessions with nothing resident (bounded memory)."""
        resident = self.tier.session_resident
        for table in (self._applied_seq, self._last_hint):
            if len(table) > _PRUNE_ABOVE:
                for session in [s for s in table if s not in resident]:
                    del table[session]
        if len(self._held) > _PRUNE_ABOVE:
            self._held = {s for s in self._held if s in resident or s in self._last_hint}
        if len(self._ended) > _PRUNE_ABOVE:
            self._ended = {s for s in self._ended if s in resident}
        if len(self._sharers) > _PRUNE_ABOVE:
            self._sharers = {k: v for k, v in self._sharers.items() if k in self._loc}

    def _apply(self, decision: Decision, now: float) -> None:
        session = decision.session_id
        if decision.seq <= self._applied_seq.get(session, -1):
            return  # duplicate or older than what we applied (newest per session wins)
        self._applied_seq[session] = decision.seq
        if session not in self._held and session not in self.tier.session_resident:
            # Another engine's session (the push channel fans out to all adapters): nothing
            # of it is here, and its next request here carries its tags itself.
            self.stats["decisions_applied"] += 1
            self.stats["decisions_foreign"] += 1
            return
        wall = time.time()
        gap = decision.expected_gap_s
        if decision.wakeup_at is not None:
            gap = max(0.0, decision.wakeup_at - wall)
        ttl: float | None = None
        if decision.host_ttl_s is not None:
            issued = decision.issued_at or wall
            ttl = max(0.0, issued + decision.host_ttl_s - wall)
        last = decision.last_turn or decision.state == "finished"
        hint = SessionHint(
            expected_gap_s=gap,
            last_turn=last,
            suspended=decision.state == "suspended",
            parent=decision.parent,
            host_ttl_s=ttl,
        )
        if decision.state == "suspended":
            # The timer as issued (the tracker reports the branch and the time held).
            self.resumes.suspended(session, decision.issued_at, decision.host_ttl_s)
        elif last:
            self.resumes.forget(session)
        if last:
            self._ended.add(session)
        if last:
            self._last_hint.pop(session, None)
        else:
            self._last_hint[session] = hint
        self.stats["decisions_applied"] += 1
        before = self.core.counters["ttl_expiries"]
        self._drop_victims(self.tier.hint(session, hint, now), now)
        self.stats["ttl_expiries"] += self.core.counters["ttl_expiries"] - before
        self._refresh_timer()


def _victim_keys(
    key_at: list[list[OffloadKey | None]], victim: Victim
) -> list[tuple[OffloadKey, EvictionClass]]:
    """The keys of ``victim``'s blocks with its class, in the order the core evicts them."""
    seg, start, stop = victim.run
    keys = key_at[seg][start:stop]
    if victim.descending:
        keys.reverse()
    cls = victim.cls
    return [(k, cls) for k in keys if k is not None]


def _merge(locs: Sequence[_Loc]) -> list[Run]:
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
