"""Which turns gain from evict_waiting: split the per-turn change (with minus without) by whether
the turn's own copy was taken while it was queued. Usage: who_gains.py SEED (acceptance point)."""
import os
import sys

import numpy as np

from tenure.service.policy.density import TenureDensity
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

seed = int(sys.argv[1])
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
taken: set[tuple[str, float]] = set()  # (session, arrival of the queued request)
started: dict[str, float] = {}
orig_start, orig_sel = TenureDensity.on_request_start, TenureDensity.select_victims


def on_start(self, session, now):
    started[session] = now
    return orig_start(self, session, now)


def select(self, n, incoming, protected, now):
    out = orig_sel(self, n, incoming, protected, now)
    for v in out or ():
        owner = self.tier.owner(v.run.seg)
        life = self.lives.get(owner)
        if life is not None and life.active and owner not in self._admitted:
            taken.add((owner, started[owner]))
    return out


TenureDensity.on_request_start, TenureDensity.select_victims = on_start, select
runs = {}
for flag in (0.0, 1.0):
    taken_before = set(taken)
    runs[flag] = simulate(trace, ReplayConfig("tenure-density", hw, 32.0, 0.001, seed,
                                              policy_params={"evict_waiting": flag}))
ids = {s.id: i for i, s in enumerate(trace.sessions)}


def table(run):
    sess = np.frombuffer(run.turn_session, dtype=np.int64)
    idx = np.frombuffer(run.turn_index, dtype=np.int64)
    arr = np.frombuffer(run.arrival_s, dtype=np.float64)
    jct = np.frombuffer(run.jct_s, dtype=np.float64)
    return {(int(s), int(k)): (a, j) for s, k, a, j in zip(sess, idx, arr, jct)}


base, new = table(runs[0.0]), table(runs[1.0])
hit = {(ids[s], a) for s, a in taken}
lost, other = [], []
for key, (a, j) in new.items():
    (lost if (key[0], a) in hit else other).append(j - base[key][1])
for name, xs in (("turns whose copy was taken while queued", lost), ("all other turns", other)):
    xs = np.array(xs)
    print(f"{name}: {xs.size} turns, mean change {xs.mean():+.2f} s, sum {xs.sum():+.0f} s")
print(f"pooled p95 without / with: {np.percentile([j for _, j in base.values()], 95):.1f} / "
      f"{np.percentile([j for _, j in new.values()], 95):.1f} s")
