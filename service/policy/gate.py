"""The Tenure capacity gate (seed 000, section 4) and its ablations.

On a store that needs room, victims are taken strictly by lifecycle class — finished sessions
first, then overdue ones (now > expected wake-up + slack; most overdue first), then far-wakeup
ones (largest predicted wake-up first) — never by plain recency. Admission is decided with the
same yardstick ("refuse worst"): a live resident is evicted only if its predicted wake-up is
later than the incoming session's; when no such resident frees enough room, the incoming store
is refused and nothing changes. A declared last turn reclaims the session at once.

Variants (registered names):

* ``tenure`` — gaps predicted online from the stop reason (what a real harness provides).
* ``tenure-exact-gap`` — the true next gap, as the seed's replay feeds it.
* ``tenure-tags-off`` — no hints at all: a session's wake-up is learned from the traffic by a
  :class:`~tenure.service.policy.gap_learner.GapLearner` (per tenant and per session: the
  distribution of idle gaps given the session's turn count and previous gap, its own gaps, and
  the chance it has ended), at the ``gap_quantile``; a session that more likely than not has
  ended wakes "never" (a newcomer that will be back may displace it, one that will not may
  not), overdue on the same schedule as if it came back. With ``learn_gaps`` = 0 the old rule: last
  activity plus one horizon for all (a high quantile of the idle gaps observed so far).

Every variant uses the learner wherever a session has no gap hint (``tenure`` on a route or a
trace without stop reasons: the caller then sends no gap, see ``TierPolicy.learns_gaps``).
* ``gate-only-literal`` — the literal reading "refuse when the live working set is full": only
  finished sessions are ever evicted; a newcomer that does not fit is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from tenure.service.policy.base import HintSource, PolicyParams
from tenure.service.policy.gap_learner import MODELS, GapLearner
from tenure.service.policy.sessions import SessionLife, SessionPolicy
from tenure.service.policy.types import EvictionClass, Run, SessionHint, Victim
from tenure.service.policy.wake_index import WakeIndex

__all__ = ["GateOnlyLiteral", "TenureExactGap", "TenureGate", "TenureTagsOff"]


class TenureGate(SessionPolicy):
    name = "tenure"
    admission = True
    hint_source: ClassVar[HintSource] = "predicted"
    reclaims = True
    learns_gaps = True
    defaults = {
        # A session is overdue once idle past its wake-up by max(slack_s, slack_frac * gap).
        "overdue_slack_s": 30.0,
        "overdue_slack_frac": 0.5,
        # Hint-free horizon: this quantile of observed idle gaps (fallback before 5 samples).
        "idle_quantile": 0.9,
        "idle_fallback_s": 300.0,
        # 1: evict live far-wakeup residents when the newcomer wakes sooner ("refuse worst").
        "evict_far_wakeup": 1.0,
        # 1: evict overdue residents (0 only in the literal ablation).
        "evict_overdue": 1.0,
        # 1: a session without a gap hint gets its wake-up from the gap learner (0: horizon).
        "learn_gaps": 1.0,
        # The learned wake-up: this quantile of the session's predicted gap distribution
        # (chosen on the dev split, seeds 10-13: 0.5 / 0.75 / 0.9; results/ladder/README.md).
        "gap_quantile": 0.75,
        # 1: learn which sessions end (idle past end_factor x the 99th gap percentile).
        "learn_ends": 1.0,
        "end_factor": 2.0,
        # A session whose learned chance of another turn is below this has probably ended.
        "end_threshold": 0.5,
        # What the learner mixes (ablations): 0 tenant + context + session histograms,
        # 1 the tenant's histogram alone, 2 one log-normal per tenant.
        "gap_model": 0.0,
    }
    sweep = {"overdue_slack_s": (10.0, 30.0, 120.0), "idle_quantile": (0.75, 0.9, 0.99)}

    def _horizon(self) -> float:
        return self.idle_horizon(self.params["idle_quantile"], self.params["idle_fallback_s"])

    def _slack_for(self, gap: float) -> float:
        return max(self.params["overdue_slack_s"], self.params["overdue_slack_frac"] * gap)

    def _slack(self, life: SessionLife) -> float:
        gap = life.expected_gap_s if life.expected_gap_s is not None else self._horizon()
        return self._slack_for(gap)

    def _incoming_wakeup(self, incoming: str | None, now: float) -> float:
        if incoming is None:
            return now + self._horizon()
        life = self.peek(incoming)
        if life.declared_last or life.finished:
            return math.inf  # its blocks will never be read again
        if life.expected_gap_s is not None:
            return now + life.expected_gap_s
        learned = self._learned_gap(incoming, pending_turn=life.active)
        if learned is None:
            return now + self._horizon()
        gap, ended = learned
        # Probably ended: it may take no room from a resident that is not (refuse worst).
        return math.inf if ended else now + gap

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._index = WakeIndex()
        #: Learned (wake-up, deadline) of idle unhinted sessions, fixed per idle spell.
        self._learned: dict[str, tuple[float, float] | None] = {}
        p = self.params
        if p["gap_model"] not in range(len(MODELS)):
            raise ValueError(f"gap_model must be one of 0..{len(MODELS) - 1}")
        self._learner: GapLearner | None = (
            GapLearner(
                learn_ends=bool(p["learn_ends"]),
                end_factor=p["end_factor"],
                model=MODELS[int(p["gap_model"])],
            )
            if p["learn_gaps"]
            else None
        )

    def _learned_gap(
        self, session: str, *, pending_turn: bool = False
    ) -> tuple[float, bool] | None:
        """The learned gap of an unhinted session and whether it has probably ended."""
        learner = self._learner
        if learner is None or not learner.ready(session):
            return None  # the horizon until the tenant has shown a few gaps
        gap = learner.quantile(session, self.params["gap_quantile"], pending_turn=pending_turn)
        back = learner.return_probability(session, pending_turn=pending_turn)
        return gap, back < self.params["end_threshold"]

    # --- index maintenance: idle resident sessions by class and wake-up ------------------

    def _reindex(self, session: str) -> None:
        life = self.lives.get(session)
        if self.tier.session_resident.get(session, 0) <= 0 or (life is not None and life.active):
            self._index.discard(session)
        elif life is None:
            # Blocks of a session that never made a request itself (another session stored
            # into its segment): no lifecycle to go by, so it counts as idle since time 0.
            self._index.add_untimed(session, 0.0)
        elif life.finished:
            self._index.add_finished(session)
        elif life.wakeup is not None:
            self._index.add_timed(session, life.wakeup, life.wakeup + self._slack(life))
        else:
            timed = self.learned_wakeup(session, life)
            if timed is None:
                self._index.add_untimed(session, life.last_activity)
            else:
                self._index.add_timed(session, *timed)

    def learned_wakeup(self, session: str, life: SessionLife) -> tuple[float, float] | None:
        """``(wake-up, overdue deadline)`` of an idle unhinted session, fixed when first asked
        in its idle spell (from what the learner knew then), or ``None`` (the horizon rule)."""
        if session in self._learned:
            return self._learned[session]
        learned = self._learned_gap(session)
        if learned is None:
            self._learned[session] = None  # not ready yet: the horizon for this idle spell
            return None
        gap, ended = learned
        last = life.last_activity
        deadline = last + gap + self._slack_for(gap)
        # A session that has probably ended wakes "never": any newcomer that will be back may
        # displace it, one that will not may not; it is overdue on the same schedule as if it
        # were coming back.
        fixed = self._learned[session] = (math.inf if ended else last + gap, deadline)
        return fixed

    def on_request_start(self, session: str, now: float) -> None:
        self._learned.pop(session, None)
        if self._learner is not None:
            self._learner.on_start(session, now)
        super().on_request_start(session, now)
        self._index.discard(session)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        if self._learner is not None:
            self._learner.on_idle(session, now)
        super().on_access(session, runs, inserted, now)
        self._reindex(session)

    def on_hint(self, session: str, hint: SessionHint, now: float) -> None:
        super().on_hint(session, hint, now)
        self._reindex(session)

    def on_insert(self, run: Run, now: float) -> None:
        owner = self.tier.owner(run.seg)
        if owner not in self._index:
            self._reindex(owner)  # blocks stored into an idle session's segment

    def on_remove(self, run: Run) -> None:
        owner = self.tier.owner(run.seg)
        if self.tier.session_resident.get(owner, 0) <= run.blocks:
            self._index.discard(owner)  # the tier is about to clear its last blocks

    def due(self, now: float) -> list[Victim]:
        victims = super().due(now)
        for owner in {self.tier.owner(v.run.seg) for v in victims}:
            self._index.discard(owner)  # reclaim and TTL expiry drop whole sessions
        return victims

    def forget(self, session: str) -> None:
        super().forget(session)
        self._index.discard(session)
        self._learned.pop(session, None)
        if self._learner is not None:
            self._learner.forget(session)

    # --- the decision ----------------------------------------------------------------------

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

        def enough(session: str, cls: EvictionClass) -> bool:
            nonlocal have
            blocks = resident.get(session, 0)
            if session in excluded or blocks <= 0:
                return False
            excluded.add(session)  # an overdue session that "never" wakes is also far: once
            order.append((session, cls))
            have += blocks
            return have >= n

        for session in self._index.finished:
            if enough(session, EvictionClass.FINISHED):
                return self._evict(order, n)
        horizon = self._horizon()
        if self.params["evict_overdue"]:
            untimed_slack = self._slack_for(horizon)
            overdue = self._index.overdue(now, lambda last: last + horizon + untimed_slack, horizon)
            for _, session in overdue:
                if enough(session, EvictionClass.OVERDUE):
                    return self._evict(order, n)
        if not self.params["evict_far_wakeup"]:
            return None
        # Refuse worst: only residents waking after the newcomer may make room for it.
        for _, session in self._index.far(self._incoming_wakeup(incoming, now), horizon):
            if enough(session, EvictionClass.FAR_WAKEUP):
                return self._evict(order, n)
        return None

    def _evict(self, order: list[tuple[str, EvictionClass]], n: int) -> list[Victim]:
        victims = self.take(order, n)
        taken: dict[str, int] = {}
        for victim in victims:
            owner = self.tier.owner(victim.run.seg)
            taken[owner] = taken.get(owner, 0) + victim.run.blocks
        for owner, blocks in taken.items():
            if blocks >= self.tier.session_resident.get(owner, 0):
                self._index.discard(owner)
        self._count_victims(victims)
        return victims


class TenureExactGap(TenureGate):
    name = "tenure-exact-gap"
    hint_source = "exact"


class TenureTagsOff(TenureGate):
    name = "tenure-tags-off"
    hint_source = "none"


class GateOnlyLiteral(TenureGate):
    name = "gate-only-literal"
    defaults = {**TenureGate.defaults, "evict_far_wakeup": 0.0, "evict_overdue": 0.0}
