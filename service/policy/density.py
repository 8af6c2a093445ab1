"""Tenure's gate ordered by value density: work saved per block per second held (issue 25).

The gate (:mod:`tenure.service.policy.gate`) ranks idle sessions by *when* they wake. What a
host copy is worth is something else: the prefill work it saves at the session's next turn,
per block of the tier, per second the tier holds it until then (Beckmann et al.'s hit density,
LHD, NSDI 2018, with the work of a hit in place of a hit count). For an idle resident session
``s`` at age ``a`` (seconds since its last turn ended)::

    density(s) = P(s comes back after the GPU let go of it | still idle at a) * v(s)
                 / E[gap - a | gap > a]

* ``v(s)`` is the work a resident block of ``s`` saves, relative to the dense part: a block at
  depth ``p`` costs ``1 + p / depth_scale_blocks`` (attention over the ``p`` blocks before it;
  ``depth_scale_blocks`` is where attention equals the dense FLOPs: ``params / (2 * layers *
  width)`` tokens over the block size), averaged over its resident head. A deep session is worth
  more per byte, as in the bound (:mod:`tenure.service.replay.bound`).
* The gap is not a point: :class:`~tenure.service.policy.gap_spread.GapSpread` learns, per bucket
  of the prediction the session was given, the distribution of the real gaps that followed such
  a prediction, so a session that outlived most of its bucket's gaps is worth little (the gate's
  "overdue", without a slack parameter) and a heavy tail lowers the expected return.
* A copy is useless for the blocks the GPU prefix cache still serves when the session comes
  back (vLLM looks the tier up from the GPU hit on), and vLLM re-offers the whole context to a
  tier that holds none of it: so the tier need not hold a session across a turn the GPU will
  serve. The GPU's LRU lets go of a session once enough blocks were computed after its last
  use, so the policy keeps an *allocation clock* (blocks computed, from each lookup: context
  past the GPU hit minus the host hit) and a rate, and
  :class:`~tenure.service.policy.gap_spread.HitYield` learns from the lookups what share of a
  held copy is loaded at each clock distance (``on_lookup``). A surviving gap ``g`` is then
  weighed by the yield at the distance the session will be at if it comes back then:
  ``d_now + rate * (g - a)``. A session that comes back in seconds, while the GPU still holds
  it, is worth little in the tier; many such do not crowd out the one the tier saves. The replay
  and the engine adapter both report each admitted request's lookup; a caller that reports
  none (vLLM's stock manager driving the policy) leaves the yield at its prior, 1.

Decisions, with the gate's invariants kept:

* A declared last turn reclaims at once; finished sessions go first (as the gate).
* Then idle residents by ascending density, each tail first (a session's head is kept when its
  whole does not fit). A resident is displaced only by a store *denser* than it (the gate's
  "only by a sooner wake-up", with density as the yardstick); otherwise the store is refused.
* A session whose request was admitted (it loads or computes) is never a victim. One whose
  request still waits in the engine's queue is scored as the incoming store is (at age 0,
  from its expected gap) and may be displaced by a denser store (``evict_waiting``).

Cost: the residents' densities change with time, so there is no static order to index. A
decision scores the idle residents, or, above ``sample`` of them, a deterministic sample of
``sample`` (LHD's own answer: sampling a few candidates loses little), so its cost does not
grow with the number of sessions. Within a decision the costly part of a score (the yield's
mean along the gap spread) is computed lazily, only for candidates that can still come next in
the order (``_ascending``); the order and the decisions are the eager sort's.

Measured and kept: ``evict_waiting`` (session 7, chosen on the dev seeds 10-13). Under load
the engine's queue is long, and a queued session's host copy, protected until its admission,
holds the tier for the whole wait while denser stores of running sessions are refused. Scored
like the store that would displace it, a shallow copy of a session that will be idle long
after this turn gives way to a deep one due back in seconds. p95 on the dev seeds: acceptance
point 224.7 -> 156.4 s, saturated 1,669.5 -> 1,512.4 s, A100 163.9 -> 150.5 s; the same rule
for admitted (computing) sessions made it worse (+18.9 s), and evicting queued copies first
regardless of density far worse (+111 s): results/ladder/README.md.

Measured and dropped: a fixed allocation-clock threshold (a session leaves the GPU once
``gpu_blocks`` blocks were computed after its last use) made it worse on the dev split (the
running requests' contexts take most of the GPU pool, and the GPU's hits at a distance are
far from a step function of it); the yield learned from lookups at a clock distance replaced
its fixed threshold.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Sequence
from typing import ClassVar

from tenure.service.policy.base import HintSource, PolicyParams
from tenure.service.policy.gap_spread import GapSpread, HitYield, Residual
from tenure.service.policy.sessions import SessionLife, SessionPolicy
from tenure.service.policy.types import EvictionClass, Run, SessionHint, Victim

__all__ = ["TenureDensity", "TenureDensityExactGap"]


class TenureDensity(SessionPolicy):
    name = "tenure-density"
    admission = True
    hint_source: ClassVar[HintSource] = "predicted"
    reclaims = True
    defaults = {
        # An engine fact (the replay fills it from the hardware profile): the context depth in
        # blocks at which a block's attention work equals its dense work (0: depth ignored).
        "depth_scale_blocks": 0.0,
        # Gap spread: window of real gaps per prediction bucket, and samples before it is used.
        "spread_window": 512.0,
        "spread_min_samples": 8.0,
        # Idle residents scored per decision above which a sample is scored instead (the
        # replay's dev-split points peak at 8 idle residents: never reached there; the cost
        # benchmark's 100-10,000 sessions are where it bounds the work).
        "sample": 16.0,
        # Window (seconds) of the allocation clock's rate (chosen on the dev split among 60,
        # 300, 1200 and 3600 s and windows of 12 or 24 lookups: results/ladder/README.md).
        "rate_window_s": 1200.0,
        # 0: ignore lookups (the yield stays 1), as where no caller reports them (ablation).
        "learn_yield": 1.0,
        # 1: a session whose request waits for admission is a candidate victim, scored as the
        # incoming store (0: every session with a request in flight is protected; ablation).
        "evict_waiting": 1.0,
    }
    sweep = {"spread_min_samples": (4.0, 8.0, 32.0)}

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self.spread = GapSpread(
            window=int(self.params["spread_window"]),
            min_samples=int(self.params["spread_min_samples"]),
        )
        self.yields = HitYield()
        # The allocation clock (blocks computed, from lookups), its recent history for the
        # rate, and each session's clock at its last use.
        self.clock = 0
        self._ticks: deque[tuple[float, int]] = deque()
        self._used_at: dict[str, int] = {}
        # A returning session's blocks held when its request started, until its lookup says
        # how many of them it loaded.
        self._returning: dict[str, int] = {}
        # Candidate victims holding blocks (idle sessions, and with ``evict_waiting`` the
        # queued ones): a list for O(1) sampling, and positions into it.
        self._idle: list[str] = []
        self._idle_pos: dict[str, int] = {}
        # Sessions whose request in flight was admitted (loads or computes: protected).
        self._admitted: set[str] = set()
        self._finished: dict[str, None] = {}
        # The prediction bucket a session went idle under, for the gap it is now in.
        self._idle_bucket: dict[str, int] = {}

    # --- membership ------------------------------------------------------------------------

    def _drop(self, session: str) -> None:
        pos = self._idle_pos.pop(session, None)
        if pos is not None:
            last = self._idle.pop()
            if last != session:
                self._idle[pos] = last
                self._idle_pos[last] = pos
        self._finished.pop(session, None)

    def _queued(self, session: str) -> bool:
        """Its request waits for admission and may lose blocks (``evict_waiting``)."""
        return bool(self.params["evict_waiting"]) and session not in self._admitted

    def _reindex(self, session: str) -> None:
        life = self.lives.get(session)
        if self.tier.session_resident.get(session, 0) <= 0 or (
            life is not None and life.active and not self._queued(session)
        ):
            self._drop(session)
        elif life is not None and life.finished:
            self._drop(session)
            self._finished[session] = None
        elif session not in self._idle_pos:
            self._finished.pop(session, None)
            self._idle_pos[session] = len(self._idle)
            self._idle.append(session)

    # --- hooks -----------------------------------------------------------------------------

    def on_request_start(self, session: str, now: float) -> None:
        life = self.lives.get(session)
        if life is not None and not life.active and life.last_activity > 0.0:
            bucket = self._idle_bucket.pop(session, None)
            if bucket is not None:
                self.spread.observe(bucket, now - life.last_activity)
            held = self.tier.session_resident.get(session, 0)
            if held > 0 and session in self._used_at:
                self._returning[session] = held
        self._admitted.discard(session)
        super().on_request_start(session, now)
        self._drop(session)  # from the finished or idle books; back in as queued if it may
        self._reindex(session)

    def on_request_admitted(self, session: str, now: float) -> None:
        self._admitted.add(session)
        self._drop(session)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        self._admitted.discard(session)
        super().on_access(session, runs, inserted, now)
        self._returning.pop(session, None)
        self._used_at[session] = self.clock
        self._note_idle(session)
        self._reindex(session)

    def on_hint(self, session: str, hint: SessionHint, now: float) -> None:
        super().on_hint(session, hint, now)
        self._note_idle(session)
        self._reindex(session)

    def on_lookup(self, session: str, blocks: int, hit: int, now: float) -> None:
        if not self.params["learn_yield"]:
            return
        held = self._returning.pop(session, None)
        if held is not None:
            distance = self.clock - self._used_at.get(session, self.clock)
            self.yields.observe(distance, hit / held)
        # What this request computes: its context past the GPU hit, less what the tier loads.
        self.clock += max(0, blocks - hit)
        ticks = self._ticks
        ticks.append((now, self.clock))
        while len(ticks) > 2 and ticks[1][0] < now - self.params["rate_window_s"]:
            ticks.popleft()

    def rate(self, now: float) -> float:
        """Blocks computed per second recently (0 before two lookups)."""
        if len(self._ticks) < 2:
            return 0.0
        t0, c0 = self._ticks[0]
        span = now - t0
        return (self.clock - c0) / span if span > 0 else 0.0

    def on_insert(self, run: Run, now: float) -> None:
        owner = self.tier.owner(run.seg)
        if owner not in self._idle_pos and owner not in self._finished:
            self._reindex(owner)  # blocks stored into an idle session's segment

    def on_remove(self, run: Run) -> None:
        owner = self.tier.owner(run.seg)
        if self.tier.session_resident.get(owner, 0) <= run.blocks:
            self._drop(owner)

    def due(self, now: float) -> list[Victim]:
        victims = super().due(now)
        for owner in {self.tier.owner(v.run.seg) for v in victims}:
            self._drop(owner)
        return victims

    def forget(self, session: str) -> None:
        super().forget(session)
        self._drop(session)
        self._idle_bucket.pop(session, None)
        self._returning.pop(session, None)
        self._used_at.pop(session, None)
        self._admitted.discard(session)

    def _note_idle(self, session: str) -> None:
        life = self.lives.get(session)
        if life is not None and not life.active and not life.finished:
            self._idle_bucket[session] = GapSpread.bucket(life.expected_gap_s)

    # --- value -----------------------------------------------------------------------------

    def _block_value(self, depth: int) -> float:
        """Mean work of a block over a resident head of ``depth`` blocks (dense part = 1)."""
        scale = self.params["depth_scale_blocks"]
        return 1.0 + (depth / 2.0 / scale if scale > 0 else 0.0)

    def _left(self, life: SessionLife, age: float) -> Residual | None:
        """The gaps like ``life``'s that outlast ``age`` (``None``: it outlived every one of
        them, so it is overdue)."""
        left = self.spread.residual(GapSpread.bucket(life.expected_gap_s), life.expected_gap_s, age)
        return None if left.survivors == 0 or left.mean_left <= 0 else left

    def _idle_terms(self, session: str, life: SessionLife, now: float) -> tuple[float, int, int]:
        """An idle session's age, resident depth and allocation-clock distance."""
        age = max(0.0, now - life.last_activity)
        depth = self.tier.session_resident.get(session, 0)
        return age, depth, self.clock - self._used_at.get(session, self.clock)

    def _density(
        self, life: SessionLife, age: float, depth: int, distance: int, now: float
    ) -> float:
        left = self._left(life, age)
        if left is None:
            return 0.0  # outlived every gap like it: overdue
        yields = self.yields
        useful = yields.prior
        if yields.version:  # before any lookup is reported every yield is the prior
            useful = yields.mean_along(distance, self.rate(now), age, left.points)
        return useful * self._block_value(depth) / left.mean_left

    def session_density(self, session: str, now: float) -> float:
        """Work saved per block-second of holding ``session`` (0: worthless; inf: a request in
        flight that may not be displaced)."""
        life = self.lives.get(session)
        if life is None:
            return 0.0  # blocks of a session that never made a request: nothing to go by
        if life.finished:
            return 0.0
        if life.active:
            if not self._queued(session):
                return math.inf
            # Queued: scored as the incoming store is (what its copy is worth after this turn).
            return self._incoming_density(session, (), now)
        return self._density(life, *self._idle_terms(session, life, now), now)

    def _incoming_density(
        self, incoming: str | None, protected: Sequence[Run], now: float
    ) -> float:
        if incoming is None:
            return 0.0
        life = self.peek(incoming)
        if life.declared_last or life.finished:
            return 0.0  # its blocks will never be read again
        depth = self.tier.session_resident.get(incoming, 0) + sum(r.blocks for r in protected)
        return self._density(life, 0.0, depth, 0, now)

    # --- the decision ------------------------------------------------------------------------

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        if n == 0:
            return []
        if self.refused_already(incoming):
            return None
        tier = self.tier
        excluded = self.excluded(incoming, protected)
        resident = tier.session_resident
        order: list[tuple[str, EvictionClass]] = []
        have = 0
        for session in self._finished:
            blocks = resident.get(session, 0)
            if session in excluded or blocks <= 0:
                continue
            order.append((session, EvictionClass.FINISHED))
            have += blocks
            if have >= n:
                return self._evict(order, n)
        worth = self._incoming_density(incoming, protected, now)
        candidates = [
            s for s in self._candidates(now, n) if s not in excluded and resident.get(s, 0) > 0
        ]
        for density, session in self._ascending(candidates, now, worth):
            if density >= worth:
                return None  # refuse: only a denser store displaces a resident
            cls = EvictionClass.OVERDUE if density == 0.0 else EvictionClass.UTILITY
            order.append((session, cls))
            have += resident[session]
            if have >= n:
                return self._evict(order, n)
        return None

    def _ascending(
        self, sessions: Sequence[str], now: float, stop: float
    ) -> Iterator[tuple[float, str]]:
        """``sorted((session_density(s, now), s) for s in sessions)``, lazily, up to the first
        density at or above ``stop`` (yielded as a value ``>= stop``, maybe a bound, and the
        last).

        The yield's mean along a candidate's gap spread is most of a decision's cost, and a
        decision mostly reads only the least dense candidate or two. So each idle candidate
        enters a heap at a lower bound (the least yield any distance reads, times the rest of
        its density, which is cheap) and its mean is computed only when that bound reaches
        the top. An entry leaves the heap exact, and only when every bound left is above it,
        so the order and every value are those of the eager sort (tested, float for float).
        """
        yields = self.yields
        if not yields.version or len(sessions) < 2:
            # Every yield is the prior (no lookup reported yet), or nothing to order.
            yield from sorted((self.session_density(s, now), s) for s in sessions)
            return
        # Below the least table value by more than the mean's rounding (16 terms): the bound
        # never passes the exact density it stands for.
        low = yields.floor() * (1.0 - 1e-9)
        rate = self.rate(now)
        resident, used_at, clock = self.tier.session_resident, self._used_at, self.clock
        heap: list[tuple[float, str, Residual | None, float, float, int]] = []
        for s in sessions:
            life = self.lives.get(s)
            if life is None or life.finished or life.active:
                # Worthless, or in flight (protected, or scored as a store): exact at once.
                heap.append((self.session_density(s, now), s, None, 0.0, 0.0, 0))
                continue
            # ``_density``'s terms (``_idle_terms`` inlined: this loop is the hot path), the
            # yield's mean left for later.
            age = max(0.0, now - life.last_activity)
            left = self._left(life, age)
            if left is None:
                heap.append((0.0, s, None, 0.0, 0.0, 0))  # overdue
                continue
            value = self._block_value(resident.get(s, 0))
            distance = clock - used_at.get(s, clock)
            heap.append((low * value / left.mean_left, s, left, value, age, distance))
        heapq.heapify(heap)
        while heap:
            density, s, spread, value, age, distance = heap[0]
            if spread is None or density >= stop:
                # Exact and least, or a bound at the stop (so is every density left).
                heapq.heappop(heap)
                yield density, s
                if density >= stop:
                    return
                continue
            # As ``_density`` computes it, so the value is the same float.
            useful = yields.mean_along(distance, rate, age, spread.points)
            heapq.heapreplace(heap, (useful * value / spread.mean_left, s, None, 0.0, 0.0, 0))

    def _candidates(self, now: float, n: int) -> Sequence[str]:
        """The idle residents to score: all, or a deterministic sample above ``sample``."""
        k = int(self.params["sample"])
        idle = self._idle
        if len(idle) <= k:
            return idle
        # k consecutive entries of the idle list (in no meaningful order: removals swap the
        # last entry in) from an offset hashed from the call's arguments, not from state, so
        # a query (or a refusal) changes nothing; O(k), unlike seeding a generator per call.
        start = (round(now * 1e6) * 2654435761 + n * 40503) % len(idle)
        window = idle[start : start + k]
        return window + idle[: k - len(window)]

    def _evict(self, order: list[tuple[str, EvictionClass]], n: int) -> list[Victim]:
        victims = self.take(order, n)
        taken: dict[str, int] = {}
        for victim in victims:
            owner = self.tier.owner(victim.run.seg)
            taken[owner] = taken.get(owner, 0) + victim.run.blocks
        for owner, blocks in taken.items():
            if blocks >= self.tier.session_resident.get(owner, 0):
                self._drop(owner)
        self._count_victims(victims)
        return victims


class TenureDensityExactGap(TenureDensity):
    """The density order fed the true next gap (the replay's clairvoyant hint): how much of the
    distance to the bound a perfect gap prediction would close."""

    name = "tenure-density-exact-gap"
    hint_source = "exact"
