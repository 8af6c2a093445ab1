"""The store-gating protocol: an offer is decided once, before vLLM asks for victims.

:meth:`StoreGate.begin_store` plans the offer's placements, asks the core's gate, and stages
the keys and victims only on admission; ``evict`` then hands vLLM the chosen victims, or
``None`` to refuse the store; ``end_store`` rolls back what vLLM did not use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

from tenure.engine_adapter.holdings import Holdings
from tenure.engine_adapter.key_map import Loc, merge_locs, victim_keys
from tenure.engine_adapter.requests import Requests
from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.policy import EvictionClass, Run

__all__ = ["StoreGate", "UndecidedOffer"]

#: The offer behind a bare ``evict(n, protected)`` and its request (vLLM's stock manager
#: decides no offer beforehand: :meth:`~tenure.engine_adapter.stock_path.StockPath.stashed_offer`).
UndecidedOffer = Callable[[int, set[OffloadKey]], tuple[list[OffloadKey], ReqContext | None]]


class StoreGate:
    """``begin_store`` / ``evict`` / ``end_store``: one decision per offer."""

    __slots__ = (
        "clock",
        "holdings",
        "keys",
        "offer_blocks",
        "pending",
        "refused",
        "requests",
        "staged_victims",
        "stats",
        "tier",
    )

    def __init__(
        self,
        *,
        holdings: Holdings,
        requests: Requests,
        stats: Counter[str],
        clock: Callable[[], float],
    ) -> None:
        self.keys = holdings.keys
        self.tier = holdings.tier
        self.holdings = holdings
        self.requests = requests
        self.stats = stats
        self.clock = clock
        #: The victims the core chose for the admitted offer, for ``evict``.
        self.staged_victims: list[tuple[OffloadKey, EvictionClass]] | None = None
        #: The core refused the offer: the next ``evict`` answers ``None``.
        self.refused = False
        #: New blocks of the admitted offer (counted as stored once vLLM inserted them).
        self.offer_blocks = 0
        #: Under vLLM's stock manager: the misses of an offer not decided yet, with the storing
        #: request (``on_store_miss`` only sees the new misses; ``evict`` sees the whole offer,
        #: ``insert`` a store that needs no room). Filled by the stock path; every roll-back
        #: here drops it.
        self.pending: tuple[list[OffloadKey], ReqContext] | None = None

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
        now = self.clock() if now is None else now
        self.unstage(now)
        requests = self.requests
        if ctx is not None:
            requests.last_ctx = ctx
        info = requests.request(ctx, now)
        session = info.session
        assert session is not None
        requests.admit(info, ctx, now)  # it computes: its lookup is behind it
        # Two passes: plan the offer's (key, segment, index) placements without touching the
        # maps, ask the gate, and write them only if it admits. Under overload most offers are
        # refused, and a refusal then costs no writes to undo.
        runs: list[Run] = []
        planned: list[tuple[OffloadKey, int, int]] = []
        held: list[Loc] = []
        run_seg = run_start = run_stop = -1
        holdings, keys = self.holdings, self.keys
        chunks, staged = holdings.chunks, holdings.staged
        key_at, loc_map = keys.key_at, keys.loc
        positions = offload_key_positions(ctx)
        unit = keys.block_tokens
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
                index = keys.index(key, ctx, info.next_index)
                unit = keys.block_tokens
            else:
                index = fallback
            other = taken.get(index)
            if other is None and index < len(slots):
                other = slots[index]
            if other is not None and other != key:
                # Same session, same position, different content (an edited or branched
                # context, or another KV group): continue in a segment whose slot is free, so
                # residency stays one key per slot.
                seg = keys.fork(session, info.tags.segment, seg, index, planned)
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
        tier = self.tier
        capacity = tier.capacity
        if capacity is not None and n_new > capacity - tier.used:
            # Victims will be chosen: what vLLM will not let go must be off limits to the core.
            if held:
                protected = protected + merge_locs(sorted(held))
            if holdings.pinned:
                protected = protected + keys.runs_of(holdings.pinned)
        misses = None
        if reported:
            misses = merge_locs([(s, i) for k, s, i in planned if k not in reported])
        # vLLM 0.33's LRU ranks a stored block by its request and position; one without a
        # position on its own (as 0.32 ranks every block).
        request = info.serial if positions and all(k in positions for k, _, _ in planned) else None
        result = tier.store(protected, session, now, misses=misses, request=request)
        if not result.admitted:
            self.refused = True
            # One refusal per distinct offer, as the simulator counts them (issue 28): vLLM
            # asks again at every step with the same keys until more of the prompt is
            # computed, and counting each ask made the live figure 4-5x the simulated one.
            offer_id = (n_new, planned[-1][0])
            if info.refused_offer == offer_id:
                self.stats["refusal_repeats"] += 1
            else:
                info.refused_offer = offer_id
                self.stats["refusals"] += 1
                self.stats["refused_blocks"] += n_new
            return False
        frontier = keys.frontier
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
        self.offer_blocks = n_new
        staged_victims: list[tuple[OffloadKey, EvictionClass]] = []
        for victim in result.victims:
            staged_victims.extend(victim_keys(key_at, victim))
        self.staged_victims = staged_victims
        return True

    def report_misses(self, keys: Sequence[OffloadKey], ctx: ReqContext | None) -> None:
        """vLLM reported store misses for a store it then could not make (no evictable room):
        the core learns from them as from the misses of a store (ARC adapts to ghost hits).
        Keys are located where the store would have put them; a slot held by other content
        (an edit: the store would fork) has no history to learn from and is skipped."""
        now = self.clock()
        info = self.requests.request(ctx, now)
        key_map = self.keys
        positions = offload_key_positions(ctx)
        unit = key_map.block_tokens
        locs: list[Loc] = []
        index = info.next_index
        for key in keys:
            pos = positions.get(key)
            if pos and unit and pos % unit == 0:
                index = pos // unit - 1
            elif pos and pos > 0:
                index = key_map.index(key, ctx, info.next_index)
                unit = key_map.block_tokens
            if key_map.occupant(info.seg, index) is None:
                locs.append((info.seg, index))
            index += 1
        self.tier.report_misses(merge_locs(locs), now)

    def unstage(self, now: float) -> None:
        """Roll back what an offer staged but vLLM never inserted (its store was dropped)."""
        self.pending = None
        holdings = self.holdings
        staged = holdings.staged
        chunks = holdings.chunks
        leftovers = [k for k in staged if k not in chunks] if staged else []
        staged.clear()
        offered, self.offer_blocks = self.offer_blocks, 0
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
                loc = self.keys.unplace(key)
                if loc is not None:
                    runs.append(Run(loc[0], loc[1], loc[1] + 1))
            self.tier.drop(runs)
        victims, self.staged_victims = self.staged_victims, None
        self.refused = False
        if victims:
            # The core chose them but vLLM never evicted them: give them back to the tier.
            self._readmit([k for k, _ in victims], now)

    def _readmit(self, keys: Iterable[OffloadKey], now: float) -> None:
        key_map, tier, chunks = self.keys, self.tier, self.holdings.chunks
        for key in keys:
            loc = key_map.loc.get(key)
            if loc is None:
                continue
            if key not in chunks:
                key_map.unplace(key)
                continue
            run = Run(loc[0], loc[1], loc[1] + 1)
            if tier.is_resident(loc[0], loc[1]):
                continue
            if not tier.store([run], tier.owner(loc[0]), now).admitted:
                self.holdings.doom(key, EvictionClass.RECENCY)

    def end_store(self, now: float | None = None) -> None:
        """vLLM finished ``prepare_store``: drop whatever the offer staged and did not use."""
        self.unstage(self.clock() if now is None else now)

    def evict(
        self, n: int, protected: set[OffloadKey], undecided: UndecidedOffer
    ) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """vLLM's ``evict``: the victims staged for the offer (``undecided`` supplies an offer
        no ``begin_store`` decided: vLLM's stock manager), or ``None`` to refuse the store."""
        if n <= 0:
            return []
        if self.refused:
            self.refused = False
            self.pending = None
            return None
        if self.staged_victims is None:
            # Stock manager: the offer is decided here, where vLLM says what it protects.
            offer, ctx = undecided(n, protected)
            if not self.begin_store(offer, ctx):
                self.refused = False
                return None
        holdings = self.holdings
        doomed, pinned = holdings.doomed, holdings.pinned
        chosen = list(self.staged_victims or ())
        self.staged_victims = None
        if len(chosen) > n:
            # The core freed more than vLLM needs (its books counted chunks vLLM still holds):
            # the surplus stays with vLLM as doomed, evicted later.
            for key, cls in chosen[n:]:
                holdings.doom(key, cls)
            chosen = chosen[:n]
        short = n - len(chosen)
        fills: list[tuple[OffloadKey, EvictionClass]] = []
        if short > 0:
            for key, cls in doomed.items():
                if key not in pinned and key not in protected:
                    fills.append((key, cls))
                    if len(fills) == short:
                        break
            for key, _ in fills:
                del doomed[key]
            short -= len(fills)
        if short > 0:
            # Room the tier does not count (chunks vLLM holds for pinned doomed keys, or a bare
            # evict() with no offer): the core picks that many more victims.
            more = self._make_room(short, protected)
            if more is not None:
                chosen.extend(more)
                short = 0
        if short > 0 or any(k in pinned or k in protected for k, _ in chosen):
            # Not enough evictable room (pinned chunks), or the core chose a key vLLM protects:
            # refuse and change nothing vLLM sees. The doomed stay doomed; the core's own
            # victims go back to the tier once the offer's staged keys are rolled back.
            for key, cls in fills:
                doomed[key] = cls
            self.staged_victims = chosen
            self.unstage(self.clock())
            self.stats["refusals_pinned"] += 1
            return None
        chosen.extend(fills)
        out: list[tuple[OffloadKey, ChunkStatus]] = []
        sharers, chunks = holdings.sharers, holdings.chunks
        loc_map, key_at = self.keys.loc, self.keys.key_at
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
        holdings, key_map = self.holdings, self.keys
        loc_of = key_map.loc.get
        locs = [loc for k in protected if (loc := loc_of(k)) is not None]
        locs += [loc for k in holdings.staged if (loc := loc_of(k)) is not None]
        keep = merge_locs(sorted(locs))
        if holdings.pinned:
            keep += key_map.runs_of(holdings.pinned)
        victims = self.tier.make_room(n, None, keep, self.clock())
        if victims is None:
            return None
        key_at = key_map.key_at
        out: list[tuple[OffloadKey, EvictionClass]] = []
        for victim in victims:
            out.extend(victim_keys(key_at, victim))
        return out
