"""Session 7 variants of tenure-density (issue 25): which sessions with a request in flight may
lose their copy. Registered by run.py; notes only."""
import math
from tenure.service.policy.density import TenureDensity

class TenureDensityActive(TenureDensity):
    """Active residents are candidates too, scored as the incoming store is (age 0), except
    those whose request loaded from the tier (their blocks are pinned by the load).
    Measured on the policy before ``evict_waiting`` existed: it is off here."""
    name = "tenure-density-active"
    defaults = {**TenureDensity.defaults, "evict_waiting": 0.0}

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

    def session_density(self, session, now):
        life = self.lives.get(session)
        if life is not None and life.active and not life.finished:
            if session in self._loaded:
                return math.inf
            depth = self.tier.session_resident.get(session, 0)
            if life.declared_last:
                return 0.0
            return self._density(life, 0.0, depth, 0, now)
        return super().session_density(session, now)

    def _candidates(self, now, n):
        base = list(super()._candidates(now, n))
        lives = self.lives
        active = [s for s in self.tier.session_resident
                  if (l := lives.get(s)) is not None and l.active and s not in self._loaded]
        return base + active

class TenureDensityActiveNoYield(TenureDensityActive):
    name = "tenure-density-active-noyield"
    defaults = {**TenureDensityActive.defaults, "learn_yield": 0.0}

class TenureDensityNoYield(TenureDensity):
    name = "tenure-density-noyield"
    defaults = {**TenureDensity.defaults, "learn_yield": 0.0, "evict_waiting": 0.0}

class TenureDensityActiveLooked(TenureDensityActive):
    """Only active sessions whose lookup is done (hit == 0) are candidates."""
    name = "tenure-density-active-looked"

    def __init__(self, params=None):
        super().__init__(params)
        self._looked = set()

    def on_lookup(self, session, runs, hit, now):
        super().on_lookup(session, runs, hit, now)
        self._looked.add(session)

    def on_request_start(self, session, now):
        self._looked.discard(session)
        super().on_request_start(session, now)

    def session_density(self, session, now):
        life = self.lives.get(session)
        if life is not None and life.active and session not in self._looked:
            return math.inf
        return super().session_density(session, now)

    def _candidates(self, now, n):
        return [s for s in super()._candidates(now, n)
                if not ((l := self.lives.get(s)) is not None and l.active and s not in self._looked)]

class TenureDensityActiveWaiting(TenureDensityActive):
    """Only active sessions whose lookup is NOT done yet (waiting) are candidates."""
    name = "tenure-density-active-waiting"

    def __init__(self, params=None):
        super().__init__(params)
        self._looked = set()

    def on_lookup(self, session, runs, hit, now):
        super().on_lookup(session, runs, hit, now)
        self._looked.add(session)

    def on_request_start(self, session, now):
        self._looked.discard(session)
        super().on_request_start(session, now)

    def session_density(self, session, now):
        life = self.lives.get(session)
        if life is not None and life.active and session in self._looked:
            return math.inf
        return super().session_density(session, now)

    def _candidates(self, now, n):
        return [s for s in super()._candidates(now, n)
                if not ((l := self.lives.get(s)) is not None and l.active and s in self._looked)]

class TenureDensityWaitZero(TenureDensityActiveWaiting):
    """Waiting sessions' copies are worth nothing (evicted first)."""
    name = "tenure-density-waitzero"
    def session_density(self, session, now):
        life = self.lives.get(session)
        if life is not None and life.active and session not in self._looked and session not in self._loaded:
            return 0.0
        return super().session_density(session, now)

class TenureDensityNoWaiting(TenureDensity):
    name = "tenure-density-nowaiting"
    defaults = {**TenureDensity.defaults, "evict_waiting": 0.0}


class TenureDensitySample4(TenureDensity):
    name = "tenure-density-s4"
    defaults = {**TenureDensity.defaults, "sample": 4.0}


class TenureDensitySample8(TenureDensity):
    name = "tenure-density-s8"
    defaults = {**TenureDensity.defaults, "sample": 8.0}


class TenureDensityNoYieldNow(TenureDensity):
    """The current policy (``evict_waiting`` on) without the learned yield: what the engine
    adapter runs, as it reports no lookups to the core."""
    name = "tenure-density-noyield-now"
    defaults = {**TenureDensity.defaults, "learn_yield": 0.0}
