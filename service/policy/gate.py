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
* ``tenure-tags-off`` — no hints at all: a session's wake-up is its last activity plus a horizon
  (a high quantile of the idle gaps observed so far), so the classes collapse to idle order, and
  the admission invariant still holds (live residents are never displaced by a newcomer).
* ``gate-only-literal`` — the literal reading "refuse when the live working set is full": only
  finished sessions are ever evicted; a newcomer that does not fit is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from tenure.service.policy.base import HintSource, PolicyParams
from tenure.service.policy.sessions import SessionLife, SessionPolicy
from tenure.service.policy.types import EvictionClass, Run, SessionHint, Victim
from tenure.service.policy.wake_index import WakeIndex

__all__ = ["GateOnlyLiteral", "TenureExactGap", "TenureGate", "TenureTagsOff"]


class TenureGate(SessionPolicy):
    name = "tenure"
    admission = True
    hint_source: ClassVar[HintSource] = "predicted"
    reclaims = True
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
        gap = life.expected_gap_s if life.expected_gap_s is not None else self._horizon()
        return now + gap

    def __init__(self, params: PolicyParams | None = None) -> None:
        super().__init__(params)
        self._index = WakeIndex()

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
            self._index.add_untimed(session, life.last_activity)

    def on_request_start(self, session: str, now: float) -> None:
        super().on_request_start(session, now)
        self._index.discard(session)

    def on_access(
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
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

    # --- the decision ----------------------------------------------------------------------

    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        if n == 0:
            return []
        if incoming is not None:
            life = self.lives.get(incoming)
            if life is not None and life.refused:
                return None  # one refusal per request: never leave a hole in a stored prefix
        tier = self.tier
        excluded = {tier.owner(run.seg) for run in protected}
        if incoming is not None:
            excluded.add(incoming)
        resident = tier.session_resident
        order: list[tuple[str, EvictionClass]] = []
        have = 0

        def enough(session: str, cls: EvictionClass) -> bool:
            nonlocal have
            blocks = resident.get(session, 0)
            if session in excluded or blocks <= 0:
                return False
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
