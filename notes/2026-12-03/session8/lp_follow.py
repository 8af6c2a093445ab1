"""A clairvoyant policy that follows the bound's own LP (issue 25 diagnostic, notes only).

Pass 1 runs a policy at the acceptance point with the bound and solves the LP on its access log,
keeping, for every request, how deep a prefix of its context the LP holds for it (the groups
with ``z >= 0.5``, from the front). Pass 2 replays the same seed with ``lp-follow``: the session
oracle (the exact next gap of every session) whose victims are first the blocks the plan does
not hold for a session's *next* turn (a session's tail past that depth, all of a session the
plan holds nothing for), and only then, for a store the plan holds, the planned blocks of the
session whose next use is farthest (Belady), if it comes back after the store's session. The
pass-2 run gets its own bound; ``--iterate K`` re-plans from each run K times. This is a policy
that knows the future of the run it plans from: its saved/bound says how much of the bound a
clairvoyant schedule of this engine reaches. Usage:
python lp_follow.py FIRST_POLICY SEED [ITERATIONS] [lp|vllm]
"""

import sys
from collections import defaultdict

import numpy as np

import tenure.service.replay.engine as eng
from tenure.service.policy.oracle import OraclePolicy
from tenure.service.policy.registry import register_policy
from tenure.service.policy.types import EvictionClass, Victim
from tenure.service.replay import bound as B
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.paths import claude_code_trace

PLAN: dict[tuple[str, int], int] = {}


class LpFollow(OraclePolicy):
    name = "lp-follow"

    def __init__(self, params=None):
        super().__init__(params)
        self.turn: dict[str, int] = {}

    def on_request_start(self, session, now):
        self.turn[session] = self.turn.get(session, -1) + 1
        super().on_request_start(session, now)

    def depth(self, session: str) -> int:
        return PLAN.get((session, self.turn.get(session, -1) + 1), 0)

    def select_victims(self, n, incoming, protected, now):
        if n == 0:
            return []
        if self.refused_already(incoming):
            return None
        cands = self.candidates(incoming, protected)
        takes: list[tuple[str, int, EvictionClass]] = []
        have = 0
        # 1. Blocks the plan does not hold for the session's next turn, farthest use first.
        ranked = sorted(((self._next_use(s, now), s) for s in cands), reverse=True)
        for use, s in ranked:
            extra = cands[s] - self.depth(s)
            if extra > 0:
                k = min(extra, n - have)
                takes.append((s, k, EvictionClass.ORACLE))
                have += k
                if have >= n:
                    return self._take(takes)
        # 2. The store itself planned? Then planned blocks of sessions due after it.
        if incoming is None:
            return None
        resident = self.tier.session_resident.get(incoming, 0)
        offer = sum(r.blocks for r in protected)
        if self.depth(incoming) < resident + offer:
            return None
        life = self.peek(incoming)
        gap = life.expected_gap_s
        mine = now + gap if gap is not None and not life.declared_last else float("inf")
        for use, s in ranked:
            if use <= mine or self.peek(s).active:
                break
            left = min(cands[s], self.depth(s))
            k = min(left, n - have)
            if k > 0:
                takes.append((s, k, EvictionClass.ORACLE))
                have += k
                if have >= n:
                    return self._take(takes)
        return None

    def _take(self, takes):
        tier = self.tier
        victims = []
        for s, k, cls in takes:
            # this session's blocks already taken by an earlier entry
            for seg in reversed(tier.segments_of(s)):
                already = sum(v.run.blocks for v in victims if v.run.seg == seg)
                avail = tier.resident_blocks(seg) - already
                m = min(k, avail)
                if m <= 0:
                    continue
                runs = tier.tail_runs(seg, already + m)
                # tail_runs(seg, already + m) covers the previous take too: keep the part
                # past ``already`` blocks from the tail.
                skip = already
                for run in runs:
                    if skip >= run.blocks:
                        skip -= run.blocks
                        continue
                    if skip:
                        run = type(run)(run.seg, run.start, run.stop - skip)
                        skip = 0
                    victims.append(Victim(run, cls))
                k -= m
                if k == 0:
                    break
        self._count_victims(victims)
        return victims


register_policy("lp-follow", f"{__name__}:LpFollow")

first, seed = sys.argv[1], int(sys.argv[2])
iterations = int(sys.argv[3]) if len(sys.argv) > 3 else 2
VLLM = len(sys.argv) > 4 and sys.argv[4] == "vllm"
trace = load_claude_code(claude_code_trace(), max_roots=200)
hw = get_profile("h100-llama3-8b")
captured = {}
orig_bound = eng._Sim._bound


def bound_hook(self, res, admitted):
    captured["admitted"] = list(admitted)
    return orig_bound(self, res, admitted)


eng._Sim._bound = bound_hook


def plan_from(res) -> dict[tuple[str, int], int]:
    admitted = captured["admitted"]
    log = [B.Access(r.runs, r.lookup_s, r.done_s, r.gpu_hit, r.host_hit, r.first_token)
           for r in admitted]
    work = B.block_work(hw, trace.block_tokens)
    cur, owner = [0], []
    orig_split = B._split

    def split(lo, hi, parts):
        pieces = orig_split(lo, hi, parts)
        owner.extend((cur[0], a, b) for a, b in pieces)
        return pieces

    def reading(log):
        for i, acc in enumerate(log):
            cur[0] = i
            yield acc

    B._split = split
    try:
        iv = B._intervals(reading(log), work, 1, vllm_offers=VLLM)
    finally:
        B._split = orig_split
    cap = res.host_capacity_blocks
    _lp, z, _m = B._solve(iv, cap)
    depth: dict[int, int] = defaultdict(int)
    for (i, a, b), zi in zip(owner, z):
        if zi >= 0.5:
            depth[i] = max(depth[i], b)
    plan = {}
    for i, r in enumerate(admitted):
        if depth.get(i, 0) > 0:
            plan[(trace.sessions[r.session].id, r.turn)] = depth[i]
    return plan


assert hw is not None
res = eng.simulate(trace, ReplayConfig(first, hw, 32.0, 0.001, seed, bound=True))
assert res.host_capacity_blocks
print(f"{first} seed {seed}: p95 {np.percentile(np.array(res.jct_s), 95):.1f} s, saved/bound {res.saved_work / res.bound_work:.3f}", flush=True)
for it in range(iterations):
    PLAN.clear()
    PLAN.update(plan_from(res))
    res = eng.simulate(trace, ReplayConfig("lp-follow", hw, 32.0, 0.001, seed, bound=True))
    print(f"lp-follow pass {it + 1} ({'vLLM-timed' if VLLM else 'bound'} LP plan, {len(PLAN)} planned turns): p95 {np.percentile(np.array(res.jct_s), 95):.1f} s, "
          f"saved/bound {res.saved_work / res.bound_work:.3f}", flush=True)

# Diagnostic: how much of the last plan the last run realized (by the target's host hit).
adm = captured["admitted"]
got = short = over = 0
for r in adm:
    d = PLAN.get((trace.sessions[r.session].id, r.turn))
    if d is None:
        if r.host_hit:
            over += 1
        continue
    if r.gpu_hit + r.host_hit >= d:
        got += 1
    else:
        short += 1
print(f"planned turns reaching their planned depth {got}, short {short}; unplanned turns with a host hit {over}")
print({k: v for k, v in res.counters.items() if "refus" in k or "evict" in k or "policy_" in k})
