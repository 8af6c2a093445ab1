"""Why a policy misses the hits that need only a short hold (issue 25 diagnostic, notes only).

Runs POLICY at the acceptance point (seed SEED), records every tier event per block (stored,
refused offer, evicted and by which class, dropped), and for each request whose first
missing block (the first block past its GPU + host hit) was held by an earlier request ended
< 60 s before the lookup, says what last happened to that block. Usage: short_holds.py POLICY SEED
"""
import sys
from collections import Counter, defaultdict

from tenure.service.policy.tier import HostTier
from tenure.service.replay import engine as eng
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

policy, seed = sys.argv[1], int(sys.argv[2])
events = defaultdict(list)  # seg -> [(t, start, stop, what)]
clock = [0.0]

o_store, o_clear, o_drop = HostTier.store, HostTier._clear, HostTier.drop


def store(self, runs, session, now, **kw):
    clock[0] = now
    res = o_store(self, runs, session, now, **kw)
    for r in runs:
        events[r.seg].append((now, r.start, r.stop, "stored" if res.admitted else "refused"))
    return res


def clear(self, victims):
    for v in victims:
        events[v.run.seg].append((clock[0], v.run.start, v.run.stop, "evicted:" + v.cls.value))
    return o_clear(self, victims)


def drop(self, runs):
    for r in runs:
        events[r.seg].append((clock[0], r.start, r.stop, "dropped"))
    return o_drop(self, runs)


HostTier.store, HostTier._clear, HostTier.drop = store, clear, drop
o_expire = HostTier.expire


def expire(self, now):
    clock[0] = now
    return o_expire(self, now)


HostTier.expire = expire
captured = {}
o_bound = eng.prefill_bound


def grab(log, capacity, work, *a, **k):
    captured["log"] = log
    return o_bound(log, capacity, work, *a, **k)


eng.prefill_bound = grab
trace = load_claude_code(claude_code_trace(), max_roots=200)
res = eng.simulate(trace, ReplayConfig(policy, get_profile("h100-llama3-8b"), 32.0, 0.001, seed, bound=True))
log = captured["log"]

last_done = {}  # (seg, index-bucket) -> last completion of a request holding it: per seg, list
seg_done = defaultdict(list)  # seg -> [(done, stop)] of earlier requests
outcome = Counter()
blocks_by = Counter()
for acc in log:
    eligible = sum(r.stop - r.start for r in acc.runs) - acc.gpu_hit
    if eligible > 0 and acc.host_hit < eligible:
        p = acc.gpu_hit + acc.host_hit  # the first block the tier did not serve
        pos = 0
        for run in acc.runs:
            if pos + run.stop - run.start > p:
                seg, idx = run.seg, run.start + p - pos
                break
            pos += run.stop - run.start
        prev = [d for d, stop in seg_done[seg] if stop > idx and d <= acc.lookup_s]
        if prev:
            hold = acc.lookup_s - max(prev)
            cls = "<60 s" if hold < 60 else ">=60 s"
            last = None
            for t, a, b, what in events.get(seg, ()):
                if a <= idx < b and t <= acc.lookup_s:
                    last = what
            key = (cls, last or "never offered")
            outcome[key] += 1
            blocks_by[key] += eligible - acc.host_hit
    for run in acc.runs:
        seg_done[run.seg].append((acc.done_s, run.stop))
print(f"{policy} seed {seed}: requests missing part of an earlier-held context, by what last "
      "happened to the first block it missed")
for (cls, what), n in sorted(outcome.items()):
    print(f"  {cls:>7} {what:>22}: {n:5d} requests, {blocks_by[(cls, what)]:8d} blocks missed")
