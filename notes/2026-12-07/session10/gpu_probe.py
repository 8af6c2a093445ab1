"""Probe: tenure-density with the GPU prefix cache's present state in place of the learned yield.

Session 9 found that what an online policy lacks is mostly which blocks the GPU will still
serve at a session's next turn (a clairvoyant that knows the GPU's future hits: 0.526 of the
bound; without them: 0.425; tenure-density with its learned yield: 0.392). The GPU's LRU is not
the future, though: its present state (each segment's cached prefix and how many evictable
blocks stand ahead of it in the free queue) is known to the engine now. This probe measures
what that present state is worth, in the replay only (vLLM exposes no seam for it to the
offloading manager).

The useful share of a held copy at a return after X more GPU allocations is
max(0, H - R(X)) / H: H the session's host blocks, R(X) the blocks the GPU still caches then
(each segment loses its cached prefix tail-first once X exceeds the empty room plus the
evictable blocks ahead of it; a segment a running request pins is counted as freed at the MRU
end). X = rate * (g - age), over the same gap points as the learned yield (rate: the
allocation clock's, blocks computed per second).

Usage: python gpu_probe.py [SEEDS] [MODE]   MODE: gpu (default) | gpu-alloc (X from every block
placed on the GPU past its hit, loads included) | yield (the policy as it is); a suffix
"-exact" feeds the true next gap (gpu-exact, gpu-alloc-exact)
"""

from __future__ import annotations

import sys

import numpy as np

import tenure.service.replay.engine as eng
import tenure.service.replay.sim_state as sim_state
from tenure.service.policy.density import TenureDensity
from tenure.service.policy.registry import register_policy
from tenure.service.policy.sessions import SessionLife
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace


class GpuStateDensity(TenureDensity):
    name = "tenure-density-gpu"
    gpu = None  # the replay's GpuPrefixCache, set after the sim is built

    def _ahead(self) -> tuple[dict[int, int], int]:
        """Per free segment, the blocks the GPU frees before it starts on that segment; and the
        room before a pinned segment (freed at the MRU end) is touched."""
        gpu = self.gpu
        ahead: dict[int, int] = {}
        acc = gpu.capacity - gpu.held
        for seg in gpu._free:
            ahead[seg] = acc
            acc += gpu.cached[seg]
        return ahead, acc

    def _density(self, life: SessionLife, age: float, depth: int, distance: int, now: float) -> float:
        from tenure.service.policy.gap_spread import GapSpread

        bucket = GapSpread.bucket(life.expected_gap_s)
        left = self.spread.residual(bucket, life.expected_gap_s, age)
        if left.survivors == 0 or left.mean_left <= 0:
            return 0.0
        useful = 1.0
        session = self._scoring
        if self.gpu is not None and session is not None and depth > 0:
            ahead, pinned_ahead = self._cache
            cached = self.gpu.cached
            segs = [(cached[s], ahead.get(s, pinned_ahead)) for s in self.tier.segments_of(session) if cached[s] > 0]
            rate = self.rate(now) if self.x_rate == "clock" else self.alloc_rate(now)
            total = 0.0
            points = left.points
            for g in points:
                x = rate * (g - age)
                kept = sum(c - min(c, max(0.0, x - a)) for c, a in segs)
                total += max(0.0, depth - kept) / depth
            useful = total / len(points)
        return useful * self._block_value(depth) / left.mean_left

    #: "alloc": X counts every block a request places on the GPU past its GPU hit (computed
    #: and loaded), not only the computed ones (the allocation clock's rate).
    x_rate = "clock"
    _alloc = 0
    _alloc_ticks: list[tuple[float, int]] = []

    def on_lookup(self, session: str, blocks: int, hit: int, now: float) -> None:
        super().on_lookup(session, blocks, hit, now)
        if not self._alloc_ticks:
            self._alloc_ticks = []
        self._alloc += blocks
        self._alloc_ticks.append((now, self._alloc))
        cut = now - self.params["rate_window_s"]
        while len(self._alloc_ticks) > 2 and self._alloc_ticks[1][0] < cut:
            self._alloc_ticks.pop(0)

    def alloc_rate(self, now: float) -> float:
        t = self._alloc_ticks
        if len(t) < 2 or now <= t[0][0]:
            return 0.0
        return (self._alloc - t[0][1]) / (now - t[0][0])

    _scoring: str | None = None
    _cache: tuple[dict[int, int], int] = ({}, 0)

    def session_density(self, session: str, now: float) -> float:
        self._scoring = session
        try:
            return super().session_density(session, now)
        finally:
            self._scoring = None

    def _incoming_density(self, incoming, protected, now):  # type: ignore[no-untyped-def]
        self._scoring = incoming
        try:
            return super()._incoming_density(incoming, protected, now)
        finally:
            self._scoring = None

    def select_victims(self, n, incoming, protected, now):  # type: ignore[no-untyped-def]
        if self.gpu is not None:
            self._cache = self._ahead()
        return super().select_victims(n, incoming, protected, now)


register_policy("tenure-density-gpu", f"{__name__}:GpuStateDensity")
_init = sim_state.SimState.__init__


def _wired(self, *a, **k):  # type: ignore[no-untyped-def]
    _init(self, *a, **k)
    policy = self.tier.policy
    if isinstance(policy, GpuStateDensity):
        policy.gpu = self.gpu


sim_state.SimState.__init__ = _wired  # type: ignore[method-assign]

if __name__ == "__main__":
    seeds = [int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "0,1,2").split(",")]
    mode = sys.argv[2] if len(sys.argv) > 2 else "gpu"
    policy = "tenure-density" if mode == "yield" else "tenure-density-gpu"
    GpuStateDensity.x_rate = "alloc" if mode.startswith("gpu-alloc") else "clock"
    if mode.endswith("-exact"):  # fed the true next gap, as tenure-density-exact-gap
        GpuStateDensity.hint_source = "exact"
    trace = load_claude_code(claude_code_trace(), max_roots=200)
    hw = get_profile("h100-llama3-8b")
    s = b = 0.0
    for seed in seeds:
        res = eng.simulate(trace, ReplayConfig(policy, hw, 32.0, 0.001, seed, bound=True))
        s += res.saved_work
        b += res.bound_work
        print(f"{mode} seed {seed}: saved/bound {res.saved_work / res.bound_work:.3f}  turn p95 {float(np.percentile(res.jct_s, 95)):.1f} s", flush=True)
    print(f"{mode} pooled: {s / b:.3f}", flush=True)
