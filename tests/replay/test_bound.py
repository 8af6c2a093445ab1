"""The bound on saved prefill work: above exhaustive search, above every policy, and not vacuous."""

from __future__ import annotations

import itertools
import random

import pytest

from tenure.service.policy import policy_names
from tenure.service.policy.types import Run
from tenure.service.replay.bound import Access, BlockWork, block_work, prefill_bound, saved_work
from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.model import Trace

H100 = get_profile("h100-llama3-8b")
WORK = BlockWork(alpha=1.0, beta=0.5)  # a deep block is worth more than a shallow one


def _blocks(acc: Access) -> list[tuple[int, int]]:
    return [(seg, i) for seg, start, stop in acc.runs for i in range(start, stop)]


def _exhaustive(log: list[Access], capacity: int, at_prefill_end: bool = False) -> float:
    """The best any offline policy does: dynamic programming over every resident set.

    A request's blocks may enter the tier when it completes (no earlier: they are computed
    while it runs), or with ``at_prefill_end`` when its prefill ends (an engine that stores
    prompt blocks during the prefill); the tier may drop anything at any time; at a lookup the
    hit is the longest run of resident blocks from the GPU hit on. Stores at a lookup's instant
    come first.
    """
    events = sorted(
        [(a.first_token_s if at_prefill_end else a.done_s, 0, i) for i, a in enumerate(log)]
        + [(a.lookup_s, 1, i) for i, a in enumerate(log)]
    )
    best: dict[frozenset[tuple[int, int]], float] = {frozenset(): 0.0}
    for _t, kind, i in events:
        acc = log[i]
        blocks = _blocks(acc)
        nxt: dict[frozenset[tuple[int, int]], float] = {}
        for state, value in best.items():
            if kind == 1:
                h = 0
                for b in blocks[acc.gpu_hit :]:
                    if b not in state:
                        break
                    h += 1
                gain = WORK.range(acc.gpu_hit, acc.gpu_hit + h)
                nxt[state] = max(nxt.get(state, -1.0), value + gain)
                continue
            pool = sorted(state | set(blocks))
            for k in range(min(capacity, len(pool)) + 1):
                for keep in itertools.combinations(pool, k):
                    key = frozenset(keep)
                    nxt[key] = max(nxt.get(key, -1.0), value)
        best = nxt
    return max(best.values())


def _random_log(rng: random.Random) -> list[Access]:
    """A few sessions over a shared prompt segment (0), each growing its own segment."""
    sessions = rng.randint(1, 3)
    log: list[tuple[float, Access]] = []
    for s in range(sessions):
        t = rng.uniform(0, 4)
        grown = 0
        for _turn in range(rng.randint(2, 3)):
            grown += rng.randint(0, 2)
            runs = (Run(0, 0, 1), Run(1 + s, 0, grown)) if grown else (Run(0, 0, 1),)
            n = 1 + grown
            done = t + rng.uniform(0.1, 2.0)
            g = rng.choice([0, 0, rng.randint(0, n)])
            log.append((t, Access(runs, t, done, g)))
            t = done + rng.uniform(0.0, 3.0)
    log.sort(key=lambda x: x[0])
    return [a for _t, a in log]


@pytest.mark.parametrize("seed", range(40))
def test_bound_is_at_least_exhaustive_search(seed: int) -> None:
    rng = random.Random(seed)
    log = _random_log(rng)
    capacity = rng.randint(0, 3)
    best = _exhaustive(log, capacity)
    bound = prefill_bound(log, capacity, WORK)
    assert bound.work >= best - 1e-9, (best, bound)
    assert prefill_bound(log, capacity, WORK, pieces_per_request=4).work >= best - 1e-9


def test_bound_is_tight_where_the_answer_is_obvious() -> None:
    """One block re-read after a gap: held iff the tier has room; a deeper block is worth more."""
    seg = (Run(0, 0, 1),)
    log = [Access(seg, 0.0, 1.0, 0), Access(seg, 5.0, 6.0, 0)]
    assert prefill_bound(log, 0, WORK).work == 0.0
    assert prefill_bound(log, 1, WORK).work == pytest.approx(WORK.range(0, 1), rel=1e-5)
    # Two sessions overlap in time with one slot: only the more valuable (deeper) one fits.
    a = (Run(0, 0, 1),)
    b = (Run(1, 0, 3),)
    log = [
        Access(a, 0.0, 1.0, 0),
        Access(b, 0.0, 1.0, 2),
        Access(a, 5.0, 6.0, 0),
        Access(b, 5.0, 6.0, 2),
    ]
    assert prefill_bound(log, 1, WORK).work == pytest.approx(WORK.range(2, 3), rel=1e-5)
    assert _exhaustive(log, 1) == pytest.approx(WORK.range(2, 3))
    # A block never computed before cannot hit, and blocks past it cannot either.
    log = [Access(a, 0.0, 1.0, 0), Access((Run(0, 0, 1), Run(2, 0, 1)), 5.0, 6.0, 0)]
    assert prefill_bound(log, 5, WORK).work == pytest.approx(WORK.range(0, 1), rel=1e-5)


def test_work_weights_follow_the_roofline() -> None:
    w = block_work(H100, 16)
    per_token_dense = 2.0 * H100.params
    assert w.range(0, 1) > 16 * per_token_dense  # plus attention
    assert w.range(1000, 1001) > w.range(0, 1)
    assert w.range(0, 10) == pytest.approx(sum(w.range(i, i + 1) for i in range(10)))


def test_bound_is_at_least_every_registered_policy_on_a_real_slice(claude_small: Trace) -> None:
    """Every policy's saved work on its own run of real sessions stays under that run's bound."""
    seen = 0
    for policy in policy_names():
        run = simulate(claude_small, ReplayConfig(policy, H100, 8.0, 1 / 120, 0, bound=True))
        assert run.bound_work == run.bound_work, policy  # computed
        assert run.saved_work <= run.bound_work, (policy, run.saved_work, run.bound_work)
        # The replay's engine offers prompt blocks only during the prefill: the tighter bound
        # holds for every policy too, and is never above the completion-timed one.
        tight = run.bound_prefill_work
        assert run.saved_work <= tight <= run.bound_work * (1 + 1e-5), (policy, tight)
        if sum(run.host_hit_tokens) > 0:
            assert run.saved_work > 0, policy
            seen += 1
    assert seen >= 5  # the check bit on policies that do hit


def test_saved_work_counts_hits_past_the_gpu_prefix() -> None:
    acc = Access((Run(0, 0, 10),), 0.0, 1.0, gpu_hit=3, host_hit=4)
    assert saved_work([acc], WORK) == pytest.approx(WORK.range(3, 7))


@pytest.mark.parametrize("seed", range(20))
def test_the_diagnostics_never_exceed_the_bound(seed: int) -> None:
    """Both diagnostics only take renewals away (or make them later): never above the bound."""
    rng = random.Random(100 + seed)
    log = _random_log(rng)
    log = [
        Access(a.runs, a.lookup_s, a.done_s, a.gpu_hit, rng.choice([0, 1]), a.lookup_s + 0.05)
        for a in log
    ]
    capacity = rng.randint(1, 3)
    # Within the LP's tolerance (HiGHS's 1e-7, padded by 1e-6).
    bound = prefill_bound(log, capacity, WORK).work * (1 + 1e-5)
    assert prefill_bound(log, capacity, WORK, hold_across_gpu=True).work <= bound
    assert prefill_bound(log, capacity, WORK, vllm_offers=True).work <= bound


def test_holding_across_a_gpu_served_use_costs_the_slot() -> None:
    """Block a is computed at 0, served by the GPU at 10, missed at 20; block b needs the one
    slot over [3, 5). The bound renews a at its GPU-served use (stored again at 11) and has
    both hits; the diagnostic must hold a from 1 to 20, across b's interval: only one fits."""
    a, b = (Run(0, 0, 1),), (Run(1, 0, 1),)
    log = [
        Access(a, 0.0, 1.0, 0),
        Access(b, 2.0, 3.0, 0),
        Access(b, 5.0, 6.0, 0),
        Access(a, 10.0, 11.0, 1),  # the GPU holds it: nothing to load
        Access(a, 20.0, 21.0, 0),
    ]
    one = WORK.range(0, 1)
    assert prefill_bound(log, 1, WORK).work == pytest.approx(2 * one, rel=1e-5)
    assert prefill_bound(log, 1, WORK, hold_across_gpu=True).work == pytest.approx(one, rel=1e-5)


def test_vllm_offers_renew_only_what_a_request_offered() -> None:
    """A request that loaded a block (host hit) does not offer it again: a later hit must have
    held it since the offer before. With another block needing the slot in between, only one
    of the two hits fits; the bound renews at the loading request's completion and has both."""
    a, b = (Run(0, 0, 1),), (Run(1, 0, 1),)
    log = [
        Access(a, 0.0, 1.0, 0, 0, 0.5),
        Access(a, 10.0, 11.0, 0, 1, 10.5),  # loaded from the tier: not offered again
        Access(b, 2.0, 3.0, 0, 0, 2.5),
        Access(b, 5.0, 6.0, 0, 0, 5.5),
        Access(a, 20.0, 21.0, 0, 0, 20.5),
    ]
    log.sort(key=lambda acc: acc.lookup_s)
    one = WORK.range(0, 1)
    assert prefill_bound(log, 1, WORK).work == pytest.approx(2 * one, rel=1e-5)
    assert prefill_bound(log, 1, WORK, vllm_offers=True).work == pytest.approx(one, rel=1e-5)


@pytest.mark.parametrize("seed", range(40))
def test_prefill_timed_bound_is_at_least_exhaustive_search(seed: int) -> None:
    """Blocks stored by the end of their holder's prefill: the tighter bound is still above the
    best schedule of such an engine, and never above the completion-timed bound."""
    rng = random.Random(500 + seed)
    log = [
        Access(a.runs, a.lookup_s, a.done_s, a.gpu_hit, 0, rng.uniform(a.lookup_s, a.done_s))
        for a in _random_log(rng)
    ]
    capacity = rng.randint(0, 3)
    best = _exhaustive(log, capacity, at_prefill_end=True)
    tight = prefill_bound(log, capacity, WORK, prefill_stores=True).work
    assert tight >= best - 1e-9, (best, tight)
    assert tight <= prefill_bound(log, capacity, WORK).work * (1 + 1e-5)


def test_prefill_timed_bound_charges_the_decode() -> None:
    """Block a's holder prefills by 1 and decodes until 10; block b needs the one slot over
    [0.6, 9). Stored at completion, a's hold [10, 12) misses b's and both hit; stored at the
    prefill's end, a must be held from 1, across b's interval: only one fits."""
    a, b = (Run(0, 0, 1),), (Run(1, 0, 1),)
    log = [
        Access(b, 0.0, 0.6, 0, 0, 0.5),
        Access(a, 0.5, 10.0, 0, 0, 1.0),
        Access(b, 9.0, 9.5, 0, 0, 9.2),
        Access(a, 12.0, 13.0, 0, 0, 12.5),
    ]
    one = WORK.range(0, 1)
    assert prefill_bound(log, 1, WORK).work == pytest.approx(2 * one, rel=1e-5)
    assert prefill_bound(log, 1, WORK, prefill_stores=True).work == pytest.approx(one, rel=1e-5)
    assert _exhaustive(log, 1, at_prefill_end=True) == pytest.approx(one)
    # Unknown prefill ends (-1) fall back to completion: the bound is unchanged.
    blind = [Access(x.runs, x.lookup_s, x.done_s, x.gpu_hit) for x in log]
    blind_bound = prefill_bound(blind, 1, WORK, prefill_stores=True).work
    assert blind_bound == pytest.approx(2 * one, rel=1e-5)
