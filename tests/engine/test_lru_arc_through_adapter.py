"""The core's ``lru`` / ``arc`` behind the adapter decide exactly as vLLM's own policies.

``tests/policy/test_vllm_differential.py`` compares the core's ``HostTier`` with vLLM's manager
directly. Here the whole adapter sits in between: ``tenure-lru`` / ``tenure-arc`` (the core's
policies as vLLM cache policies) under Tenure's manager and under vLLM's stock manager, driven
in lockstep with vLLM's own ``lru`` / ``arc`` by :mod:`tests.engine.offload_driver`'s scheduler
traffic — loads and stores completing late, failed stores, shared prefixes, context edits,
direct ``touch`` calls, ``reset_cache``, vLLM's store threshold — and every ``prepare_store``
must store the same keys and evict the same keys in the same order, every ``lookup`` agree.

Scope of "identical block for block" (what this file pins down):

* ``lru``: identical under both managers, with or without the store threshold, with shared
  prefixes, context edits, untagged requests, resets, direct touches and two KV groups.
* ``arc``: identical under Tenure's manager, with or without the threshold, while each key has
  one position in one session's context (no shared prefix, no edits, tagged sessions) and
  touches name held keys. ARC's ghost lists are per key in vLLM and per block position in the
  core: a key re-stored at another position (another session's copy of a shared prefix, an
  edited context) is not a ghost hit for the core, and a touch of a key vLLM no longer holds
  has no position at all. Under vLLM's stock manager ARC's learning also differs (vLLM reports
  a miss when it is offered, even if the store then fails for room; the stock path decides at
  ``evict``/``insert``). Those configurations are checked for the contract only
  (``test_contract_fuzz.py``).
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from tests.engine.offload_driver import Driver, Lockstep, Mix

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module", autouse=True)
def _plugin() -> None:
    from tenure.engine_adapter.plugin import register

    register()


def _names(keys: Any) -> list[int]:
    return [int.from_bytes(bytes(k[:-4]), "big") for k in keys]


def _check(name: str, theirs: Any, ours: Any) -> None:
    if name == "prepare_store":
        assert (ours is None) == (theirs is None), f"vLLM stored: {theirs is not None}"
        if theirs is not None:
            assert _names(ours.keys_to_store) == _names(theirs.keys_to_store)
            assert _names(ours.evicted_keys) == _names(theirs.evicted_keys)
    elif name == "lookup":
        assert ours == theirs


def _run(kind: str, policy: str, threshold: int, seed: int, steps: int) -> dict[str, int]:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from tenure.engine_adapter.manager import TenureOffloadingManager
    from tenure.engine_adapter.testing.contract import instrument

    rng = random.Random(seed)
    capacity = rng.choice([6, 12, 24])
    reference = CPUOffloadingManager(
        num_chunks=capacity, cache_policy=policy, store_threshold=threshold
    )
    cls = TenureOffloadingManager if kind == "tenure" else CPUOffloadingManager
    subject = instrument(
        cls(num_chunks=capacity, cache_policy=f"tenure-{policy}", store_threshold=threshold)
    )
    evicted = 0

    def check(name: str, theirs: Any, ours: Any) -> None:
        nonlocal evicted
        _check(name, theirs, ours)
        if name == "prepare_store" and theirs is not None:
            evicted += len(theirs.evicted_keys)

    if policy == "lru":
        # Seed 1 runs a model with two KV groups (each block has a key per group).
        driver = Driver(
            Lockstep(reference, subject, check),
            rng,
            mix=Mix(touch=0.1, reset=0.003),
            groups=1 + seed % 2,
        )
    else:
        # ARC's ghost lists: vLLM's are per key, the core's per block position. They agree
        # while each key has one position in one session's context: no shared prefix, no
        # edited context, no untagged request (inferred anew), touches of held keys.
        driver = Driver(
            Lockstep(reference, subject, check),
            rng,
            mix=Mix(touch=0.1, reset=0.003, edit=0.0, untagged=0.0),
            shared_prefix=False,
            touchable=lambda k: reference._policy.get(k) is not None,
        )
    for step in range(steps):
        try:
            driver.step()
        except AssertionError as exc:
            raise AssertionError(f"seed {seed}, capacity {capacity}, step {step}: {exc}") from exc
    return {"evicted": evicted, **driver.counts}


CASES = [("lru", kind, threshold) for kind in ("tenure", "stock") for threshold in (0, 2)]
CASES += [("arc", "tenure", 0), ("arc", "tenure", 2)]


@pytest.mark.parametrize(("policy", "kind", "threshold"), CASES)
@pytest.mark.parametrize("seed", range(3))
def test_same_decisions_as_vllm(policy: str, kind: str, threshold: int, seed: int) -> None:
    seen = _run(kind, policy, threshold, seed, steps=1500)
    # The comparison ran under real pressure and covered the calls in question.
    assert seen["evicted"] > 10
    assert seen.get("touch", 0) > 0
    assert seen.get("complete_load", 0) > 0


def test_direct_touch_reorders_lru_as_vllm_does() -> None:
    """vLLM's LRU: a touch makes the touched keys the most recent; the victims are the
    untouched ones (the adapter's touch was a no-op before, so it evicted key 1), in the
    installed release's order: 0.32 ranks the store head first (2, then 4), 0.33 ranks one
    request tail first (4, then 2)."""
    from vllm.v1.kv_offload.base import ReqContext
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from tenure.engine_adapter.manager import TenureOffloadingManager
    from tenure.engine_adapter.vllm_compat import request_ranked_lru
    from tests.engine.offload_driver import key

    expected = [4, 2] if request_ranked_lru() else [2, 4]
    for cls, policy in (
        (CPUOffloadingManager, "lru"),  # vLLM's own, the reference
        (CPUOffloadingManager, "tenure-lru"),
        (TenureOffloadingManager, "tenure-lru"),
    ):
        manager = cls(num_chunks=4, cache_policy=policy)
        ctx = ReqContext(req_id="r")
        keys = [key(i) for i in (1, 2, 3, 4)]
        for i, k in enumerate(keys):
            ctx.set_offload_key_position(k, (i + 1) * 16)
        manager.prepare_store(keys, ctx)
        manager.complete_store(keys, ctx)
        manager.touch([keys[0], keys[2]], ReqContext(req_id="t"))
        out = manager.prepare_store([key(5), key(6)], ReqContext(req_id="n"))
        assert out is not None
        assert _names(out.evicted_keys) == expected, (cls.__name__, policy)
