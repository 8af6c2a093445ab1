"""Prototype: the density's hold time includes the engine's queue wait (session 8, dev seeds).

A copy is held from now until its session's next *lookup*, which is the next arrival plus the
wait in the engine's queue. Under load that wait is tens of seconds, as long as the short
gaps themselves, and a density over the gap alone overrates sessions due back in seconds.
The policy learns the recent mean wait (arrival -> admission, which it is told of) and adds
it to the expected remaining time.
"""

from collections import deque

from tenure.service.policy.density import TenureDensity, TenureDensityExactGap
from tenure.service.policy.registry import register_policy


class _Wait:
    def _wait_init(self):
        self._started: dict[str, float] = {}
        self._waits: deque[float] = deque()
        self._wait_sum = 0.0

    def on_request_start(self, session, now):
        super().on_request_start(session, now)
        self._started[session] = now

    def on_request_admitted(self, session, now):
        t = self._started.pop(session, None)
        if t is not None:
            w = max(0.0, now - t)
            self._waits.append(w)
            self._wait_sum += w
            if len(self._waits) > int(self.params["wait_window"]):
                self._wait_sum -= self._waits.popleft()
        super().on_request_admitted(session, now)

    def wait(self) -> float:
        return self._wait_sum / len(self._waits) if self._waits else 0.0

    def _density(self, life, age, depth, distance, now):
        d = super()._density(life, age, depth, distance, now)
        if d == 0.0 or not self.params["wait_weight"]:
            return d
        # d = useful * value / left  ->  useful * value / (left + w)
        left = self.spread.residual(type(self.spread).bucket(life.expected_gap_s), life.expected_gap_s, age).mean_left
        return d * left / (left + self.params["wait_weight"] * self.wait())


class DensityWait(_Wait, TenureDensity):
    name = "density-wait"
    defaults = {**TenureDensity.defaults, "wait_window": 256.0, "wait_weight": 1.0}

    def __init__(self, params=None):
        super().__init__(params)
        self._wait_init()


class DensityWaitExact(_Wait, TenureDensityExactGap):
    name = "density-wait-exact"
    defaults = {**TenureDensity.defaults, "wait_window": 256.0, "wait_weight": 1.0}

    def __init__(self, params=None):
        super().__init__(params)
        self._wait_init()


register_policy("density-wait", f"{__name__}:DensityWait")
register_policy("density-wait-exact", f"{__name__}:DensityWaitExact")
