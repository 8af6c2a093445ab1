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
from typing import ClassVar

from service.policy.base import HintSource
from service.policy.sessions import SessionLife, SessionPolicy
from service.policy.types import EvictionClass

__all__ = ["GateOnlyLiteral", "TenureExactGap", "TenureGate", "TenureTagsOff"]


class TenureGate(SessionPolicy):
    name = "tenure"
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

    def _slack(self, life: SessionLife) -> float:
        gap = life.expected_gap_s if life.expected_gap_s is not None else self._horizon()
        return max(self.params["overdue_slack_s"], self.params["overdue_slack_frac"] * gap)

    def _wakeup(self, life: SessionLife, now: float) -> float:
        if life.wakeup is not None:
            return life.wakeup
        return life.last_activity + self._horizon()

    def _incoming_wakeup(self, incoming: str | None, now: float) -> float:
        if incoming is None:
            return now + self._horizon()
        life = self.peek(incoming)
        if life.declared_last or life.finished:
            return math.inf  # its blocks will never be read again
        gap = life.expected_gap_s if life.expected_gap_s is not None else self._horizon()
        return now + gap

    def victim_order(
        self, n: int, incoming: str | None, candidates: dict[str, int], now: float
    ) -> list[tuple[str, EvictionClass]] | None:
        if incoming is not None and self.peek(incoming).refused:
            return None  # one refusal per request: never leave a hole in a stored prefix
        finished: list[tuple[float, str]] = []
        overdue: list[tuple[float, str]] = []
        live: list[tuple[float, str]] = []
        for session in candidates:
            life = self.peek(session)
            if life.finished:
                finished.append((life.last_activity, session))
            elif life.active:
                continue  # in use right now: its next wake-up is now
            else:
                wakeup = self._wakeup(life, now)
                if now > wakeup + self._slack(life):
                    overdue.append((now - wakeup, session))
                else:
                    live.append((wakeup, session))
        order = [(s, EvictionClass.FINISHED) for _, s in sorted(finished)]
        if self.params["evict_overdue"]:
            order += [(s, EvictionClass.OVERDUE) for _, s in sorted(overdue, reverse=True)]
        have = sum(candidates[s] for s, _ in order)
        if have >= n:
            return order
        if not self.params["evict_far_wakeup"]:
            return None
        incoming_wakeup = self._incoming_wakeup(incoming, now)
        for wakeup, session in sorted(live, reverse=True):
            if wakeup <= incoming_wakeup:
                break  # everyone left wakes no later than the newcomer: refuse it instead
            order.append((session, EvictionClass.FAR_WAKEUP))
            have += candidates[session]
            if have >= n:
                return order
        return None


class TenureExactGap(TenureGate):
    name = "tenure-exact-gap"
    hint_source = "exact"


class TenureTagsOff(TenureGate):
    name = "tenure-tags-off"
    hint_source = "none"


class GateOnlyLiteral(TenureGate):
    name = "gate-only-literal"
    defaults = {**TenureGate.defaults, "evict_far_wakeup": 0.0, "evict_overdue": 0.0}
