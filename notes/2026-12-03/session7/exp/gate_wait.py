import math
from tenure.service.policy.gate import TenureGate
from tenure.service.policy.types import EvictionClass

class TenureGateWaiting(TenureGate):
    """Sessions waiting for admission (request started, lookup not yet) may be displaced by the
    gate's yardstick: wake-up now + expected gap later than the incoming's. After the idle
    classes (finished, overdue, far)."""
    name = "tenure-waiting"

    def __init__(self, params=None):
        super().__init__(params)
        self._looked = set()

    def on_lookup(self, session, runs, hit, now):
        super().on_lookup(session, runs, hit, now)
        self._looked.add(session)

    def on_request_start(self, session, now):
        self._looked.discard(session)
        super().on_request_start(session, now)

    def select_victims(self, n, incoming, protected, now):
        r = super().select_victims(n, incoming, protected, now)
        if r is not None or n == 0 or self.refused_already(incoming):
            return r
        excluded = self.excluded(incoming, protected)
        resident = self.tier.session_resident
        inc = self._incoming_wakeup(incoming, now)
        waiting = []
        for s, b in resident.items():
            l = self.lives.get(s)
            if l is None or not l.active or s in excluded or s in self._looked or b <= 0:
                continue
            w = self._incoming_wakeup(s, now)
            if w > inc:
                waiting.append((w, s))
        if not waiting:
            return None
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
        for _, s in sorted(waiting, reverse=True):
            order.append((s, EvictionClass.FAR_WAKEUP)); have += resident[s]
            if have >= n:
                return self._evict(order, n)
        return None
