import math
from tenure.service.policy.gate import TenureGate
from tenure.service.policy.types import EvictionClass

class TenureGateActive(TenureGate):
    """Active residents whose request loaded nothing from the tier may be displaced too, by
    the gate's yardstick: their wake-up (now + expected gap) later than the incoming's."""
    name = "tenure-active"

    def __init__(self, params=None):
        super().__init__(params)
        self._loaded = set()

    def on_lookup(self, session, runs, hit, now):
        super().on_lookup(session, runs, hit, now)
        if hit > 0:
            self._loaded.add(session)

    def on_access(self, session, runs, inserted, now):
        self._loaded.discard(session)
        super().on_access(session, runs, inserted, now)

    def select_victims(self, n, incoming, protected, now):
        r = super().select_victims(n, incoming, protected, now)
        if r is not None or n == 0 or self.refused_already(incoming):
            return r
        # Second pass: idle far/overdue/finished as before, then active residents waking later.
        tier = self.tier
        excluded = self.excluded(incoming, protected)
        resident = tier.session_resident
        lives = self.lives
        inc = self._incoming_wakeup(incoming, now)
        actives = []
        for s, b in resident.items():
            l = lives.get(s)
            if l is None or not l.active or s in excluded or s in self._loaded or b <= 0:
                continue
            w = self._incoming_wakeup(s, now)
            if w > inc:
                actives.append((w, s))
        if not actives:
            return None
        # redo the idle order (finished, overdue, far) then actives, latest first
        order, have = [], 0
        for session in self._index.finished:
            if session not in excluded and resident.get(session, 0) > 0:
                order.append((session, EvictionClass.FINISHED)); have += resident[session]; excluded.add(session)
        horizon = self._horizon()
        untimed_slack = self._slack_for(horizon)
        for _, session in self._index.overdue(now, lambda last: last + horizon + untimed_slack, horizon):
            if session not in excluded and resident.get(session, 0) > 0:
                order.append((session, EvictionClass.OVERDUE)); have += resident[session]; excluded.add(session)
        for _, session in self._index.far(inc, horizon):
            if session not in excluded and resident.get(session, 0) > 0:
                order.append((session, EvictionClass.FAR_WAKEUP)); have += resident[session]; excluded.add(session)
        for _, s in sorted(actives, reverse=True):
            order.append((s, EvictionClass.FAR_WAKEUP)); have += resident[s]
            if have >= n:
                return self._evict(order, n)
        return None
