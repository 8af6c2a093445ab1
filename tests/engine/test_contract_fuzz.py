"""Randomised ``CachePolicy`` contract fuzz: every registered policy, both offloading managers.

vLLM's real ``CPUOffloadingManager`` and Tenure's ``TenureOffloadingManager`` run each registered
policy under :mod:`tests.engine.offload_driver`'s scheduler traffic (interleaved requests, late
and failed transfers, shared prefixes, context edits — two in one request too — declared last
turns, untagged requests, direct touches, ``reset_cache``, one or two KV groups), with and
without vLLM's store threshold. :func:`tenure.engine_adapter.testing.contract.instrument` checks
after every call: capacity, reference counts, protected keys never evicted, evict atomic (``None`` =
nothing changed), the tier's books equal to vLLM's chunk set, one key per slot.

Seeded and bounded in time: ``TENURE_FUZZ_SECONDS`` per policy (default 2, split over the two
managers and thresholds); a failure names the seed and step to replay.
"""

from __future__ import annotations

import os
import random
import time
import zlib

import pytest

from tests.engine.offload_driver import Driver, Mix, One

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

SECONDS = float(os.environ.get("TENURE_FUZZ_SECONDS", "2"))
#: (manager, store_threshold) variants each policy runs under, sharing its time budget.
VARIANTS = [("stock", 0), ("tenure", 0), ("stock", 2), ("tenure", 2)]


def _policies() -> list[str]:
    from tenure.engine_adapter.plugin import registered_policy_names

    return sorted(registered_policy_names())


def make_manager(kind: str, policy: str, capacity: int, threshold: int) -> object:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from tenure.engine_adapter.manager import TenureOffloadingManager

    cls = TenureOffloadingManager if kind == "tenure" else CPUOffloadingManager
    return cls(num_chunks=capacity, cache_policy=policy, store_threshold=threshold)


@pytest.fixture(scope="module", autouse=True)
def _plugin() -> None:
    from tenure.engine_adapter.plugin import register

    register()


@pytest.mark.parametrize("policy", _policies())
def test_contract_holds_under_random_scheduler_traffic(policy: str) -> None:
    from tenure.engine_adapter.testing.contract import instrument

    deadline = time.monotonic() + SECONDS
    budget = SECONDS / len(VARIANTS)
    steps = runs = 0
    calls: dict[str, int] = {}
    seed = 0
    while time.monotonic() < deadline or runs < len(VARIANTS):
        kind, threshold = VARIANTS[runs % len(VARIANTS)]
        seed = zlib.crc32(f"{policy}/{runs}".encode()) & 0xFFFF
        rng = random.Random(seed)
        capacity = rng.choice([4, 8, 16, 32])
        manager = instrument(make_manager(kind, policy, capacity, threshold))
        driver = Driver(
            One(manager),
            rng,
            sessions=rng.randint(2, 8),
            max_context=rng.choice([12, 40]),
            mix=Mix(reset=rng.choice([0.0, 0.004, 0.02])),
            groups=rng.choice([1, 1, 2]),
        )
        stop = time.monotonic() + budget
        step = 0
        try:
            while time.monotonic() < stop and step < 20_000:
                driver.step()
                step += 1
            driver.drain()
        except AssertionError as exc:
            raise AssertionError(
                f"{policy} under the {kind} manager (store_threshold {threshold}, capacity "
                f"{capacity}): seed {seed}, step {step}: {exc}"
            ) from exc
        steps += step
        runs += 1
        for name, n in driver.counts.items():
            calls[name] = calls.get(name, 0) + n
    # The traffic exercised what the contract is about, not just idle calls.
    assert steps > 100 * runs
    for name in ("prepare_store", "complete_store", "prepare_load", "on_request_finished"):
        assert calls.get(name, 0) > 0, name
