"""Differential test: the core's ``lru`` / ``arc`` evict exactly what vLLM's own policies evict.

vLLM's real ``CPUOffloadingManager`` (with its built-in ``LRUCachePolicy`` / ``ARCCachePolicy``)
and the core's ``HostTier`` are driven with the same request sequence — prefix lookup, load of
the hit prefix, store of the rest, request finished — and must agree on every hit length, every
refusal and every evicted block.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm.v1.kv_offload.cpu.manager")

import itertools

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from tenure.service.policy import HostTier, Run, create_policy


def _key(session: int, index: int) -> OffloadKey:
    return make_offload_key(f"s{session}-b{index}".encode().ljust(16, b"."), 0)


class _Pair:
    """vLLM's manager and the core's tier, fed identical calls."""

    def __init__(self, policy: str, capacity: int) -> None:
        self.vllm = CPUOffloadingManager(num_chunks=capacity, cache_policy=policy)
        self.tier = HostTier(create_policy(policy), capacity)
        self.decode: dict[OffloadKey, tuple[int, int]] = {}
        self.segs: dict[int, int] = {}
        self.requests = 0
        self.evicted = 0
        self.refused = 0

    def seg(self, session: int) -> int:
        if session not in self.segs:
            self.segs[session] = self.tier.segment(("s", session), f"s{session}")
        return self.segs[session]

    def request(self, session: int, length: int, chunks: int, now: float) -> None:
        """One request over blocks [0, length) of ``session``, stored in ``chunks`` steps."""
        self.requests += 1
        ctx = ReqContext(req_id=f"r{self.requests}")
        self.vllm.on_new_request(ctx)
        keys = [_key(session, i) for i in range(length)]
        for i, key in enumerate(keys):
            self.decode[key] = (self.seg(session), i)
            ctx.set_offload_key_position(key, (i + 1) * 16)
        seg = self.seg(session)
        self.tier.request_start(f"s{session}", now)

        hit = 0
        while hit < length and self.vllm.lookup(keys[hit], ctx) == LookupResult.HIT:
            hit += 1
        assert self.tier.lookup([Run(seg, 0, length)]) == hit
        if hit:
            self.vllm.prepare_load(keys[:hit], ctx)
            self.vllm.complete_load(keys[:hit], ctx)

        inserted: list[Run] = []
        cuts = random.sample(range(hit, length + 1), min(chunks, length + 1 - hit))
        bounds = sorted({hit, length, *cuts})
        for lo, hi in itertools.pairwise(bounds):
            if lo == hi:
                continue
            out = self.vllm.prepare_store(keys[lo:hi], ctx)
            result = self.tier.store([Run(seg, lo, hi)], f"s{session}", now)
            assert result.admitted == (out is not None), (lo, hi)
            if out is None:
                self.refused += 1
                continue
            ours = {(v.run.seg, i) for v in result.victims for i in range(v.run.start, v.run.stop)}
            theirs = {self.decode[k] for k in out.evicted_keys}
            assert ours == theirs
            self.evicted += len(theirs)
            self.vllm.complete_store(out.keys_to_store, ctx)
            inserted.extend(p for p in self._runs(out.keys_to_store))
        self.vllm.on_request_finished(ctx)
        self.tier.access([Run(seg, 0, length)], now, inserted=inserted)

    def _runs(self, keys: list[OffloadKey]) -> list[Run]:
        runs: list[Run] = []
        for key in keys:
            seg, index = self.decode[key]
            if runs and runs[-1].seg == seg and runs[-1].stop == index:
                runs[-1] = Run(seg, runs[-1].start, index + 1)
            else:
                runs.append(Run(seg, index, index + 1))
        return runs


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(6))
def test_same_evictions_as_vllm(policy: str, seed: int) -> None:
    """Agent-like traffic: growing contexts re-read each turn, under several capacities."""
    random.seed(seed)
    capacity = random.choice([8, 24, 64])
    pair = _Pair(policy, capacity)
    lengths = {s: 0 for s in range(random.randint(2, 6))}
    for step in range(150):
        session = random.choice(list(lengths))
        if random.random() < 0.1:
            lengths[session] = 0  # a new session reusing the id space from scratch
        lengths[session] += random.randint(1, max(2, capacity // 3))
        pair.request(session, lengths[session], random.randint(1, 3), now=float(step))
    assert pair.tier.used == pair.vllm._num_allocated_chunks - len(pair.vllm._free_list)
    assert pair.evicted > capacity  # the comparison exercised real eviction pressure
