"""Fixed-timing clairvoyant tier on a run's own access log (diagnostic, notes only).

Holds the run's timing and GPU hits fixed and replays only the host tier, with a clairvoyant
policy that knows every block's next *eligible* use (a later request whose GPU hit does not
cover it) and ranks held groups (blocks sharing one next use) by mean work / time to that use,
evicting tail-first and admitting a store only over sparser residents. Two store semantics:
vLLM's (a request offers its whole context when the tier had none of it, else only past the
blocks it loaded; stores at the prefill's end) and the bound's (every use offers its whole
context). Compares saved work with the prefill-timed bound on the same log.
Usage: python fixed.py LOG.pkl [vllm|all]
"""
import json, pickle, sys, time
from collections import defaultdict
import numpy as np
from tenure.service.replay import bound as B

log, cap, work = pickle.load(open(sys.argv[1], "rb"))
mode = sys.argv[2] if len(sys.argv) > 2 else "vllm"
nogpu = "nogpu" in mode  # the planner does not know what the GPU will serve: every use counts
t0 = time.time()
R = len(log)
L = np.array([a.lookup_s for a in log])
S = np.array([a.first_token_s if a.first_token_s >= 0 else a.done_s for a in log])

def ids(a):
    out = []
    for seg, start, stop in a.runs:
        base = seg << 24
        out.extend(range(base + start, base + stop))
    return out

blocks = [ids(a) for a in log]
# eligible uses per block: list of (r, p) in lookup order
elig = defaultdict(list)
order = np.argsort(L, kind="stable")
for r in order:
    a = log[r]
    bl = blocks[r]
    for p in range(0 if nogpu else a.gpu_hit, len(bl)):
        elig[bl[p]].append((r, p))
ptr = defaultdict(int)  # index into elig[b] of the next use not yet looked up
w = lambda p: work.alpha + work.beta * p

resident = {}  # block -> group r2
groups = {}  # r2 -> dict block -> p2
gsum = defaultdict(float)
used = 0
hits = [0] * R

def next_use(b):
    lst = elig.get(b)
    if not lst:
        return None
    i = ptr[b]
    return lst[i] if i < len(lst) else None

def add(b, r2, p2):
    global used
    resident[b] = r2
    groups.setdefault(r2, {})[b] = p2
    gsum[r2] += w(p2)
    used += 1

def remove(b):
    global used
    r2 = resident.pop(b)
    p2 = groups[r2].pop(b)
    gsum[r2] -= w(p2)
    if not groups[r2]:
        del groups[r2]
        gsum.pop(r2, None)
    used -= 1

def density(r2, now):
    g = groups[r2]
    return gsum[r2] / len(g) / max(L[r2] - now, 1e-6)

def evict(need, worth, now, protect):
    """Free ``need`` blocks from groups sparser than ``worth``; False if it cannot."""
    cands = sorted((density(r2, now), r2) for r2 in groups if r2 != protect)
    freed = 0
    victims = []
    for d, r2 in cands:
        if d >= worth:
            break
        for b, p2 in sorted(groups[r2].items(), key=lambda kv: -kv[1]):
            victims.append(b)
            freed += 1
            if freed >= need:
                break
        if freed >= need:
            break
    for b in victims:
        remove(b)
    return freed

events = [(L[r], 1, r) for r in range(R)] + [(S[r], 0, r) for r in range(R)]
events.sort()
saved = 0.0
for now, kind, r in events:
    a = log[r]
    bl = blocks[r]
    n = len(bl)
    g = a.gpu_hit
    if kind == 1:  # lookup
        h = 0
        while g + h < n and bl[g + h] in resident:
            h += 1
        hits[r] = h
        saved += work.range(g, g + h)
        for p in range(0 if nogpu else g, n):
            b = bl[p]
            ptr[b] += 1
            if b in resident:
                remove(b)
                nu = next_use(b)
                if nu is not None:
                    add(b, nu[0], nu[1])
    else:  # store at the prefill's end
        h = hits[r]
        lo = 0 if (mode.startswith("all") or h == 0) else g + h
        inc = defaultdict(list)
        for p in range(lo, n):
            b = bl[p]
            if b in resident:
                continue
            nu = next_use(b)
            if nu is None or L[nu[0]] <= now:
                continue
            inc[nu[0]].append((nu[1], b))
        ranked = sorted(inc.items(), key=lambda kv: -sum(w(p2) for p2, _ in kv[1]) / len(kv[1]) / (L[kv[0]] - now))
        for r2, items in ranked:
            items.sort()
            # The incoming group's own density (blocks of r2 already held are not merged in).
            worth = sum(w(p2) for p2, _ in items) / len(items) / (L[r2] - now)
            for p2, b in items:
                if used >= cap:
                    if evict(1, worth, now, r2) == 0:
                        break
                add(b, r2, p2)
fb = B.prefill_bound(log, cap, work, prefill_stores=True).work
b0 = B.prefill_bound(log, cap, work).work
real = B.saved_work(log, work)
print(f"{sys.argv[1]} mode {mode}: clairvoyant fixed-timing saved/bound {saved / b0:.3f} (/F-bound {saved / fb:.3f}); "
      f"the run itself {real / b0:.3f} (/F {real / fb:.3f}); {time.time() - t0:.0f}s", flush=True)
print(json.dumps({"log": sys.argv[1], "mode": mode, "clairvoyant": saved, "run": real, "bound": b0, "fbound": fb}), flush=True)
