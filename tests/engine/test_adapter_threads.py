"""The adapter under vLLM 0.33's threading: calls from several threads, serialised by a lock.

vLLM 0.33's tiering manager holds a real lock and a background thread polls its tiers, so the
policy's calls can come from different threads, each under the manager's lock (vLLM's rule:
every caller holds ``manager.lock``; a manager never takes it itself). The push channel's
thread meanwhile only appends to the policy's inbox. Two scheduler-like threads drive one
Tenure manager here, each step under one lock, while a third thread keeps pushing snapshots;
:func:`tenure.engine_adapter.testing.contract.instrument` checks the contract after every call. The
same file runs on vLLM 0.32 (no ``lock`` attribute: a plain lock stands in) and 0.33.
"""

from __future__ import annotations

import random
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest

from tests.engine.offload_driver import Driver, Mix, One

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module", autouse=True)
def _plugin() -> None:
    from tenure.engine_adapter.plugin import register

    register()


def _driver(target: One, seed: int, prefix: str, serial_base: int) -> Driver:
    # No reset_cache: vLLM guarantees no completion of a transfer from before a reset, which
    # the two drivers' separate books of in-flight transfers cannot promise each other.
    driver = Driver(target, random.Random(seed), mix=Mix(touch=0.05, reset=0.0))
    # Its own block serials and session names, so the two threads are two sets of requests.
    driver._serial = serial_base
    driver.system = [driver._new_block() for _ in driver.system]
    driver.contexts = {f"{prefix}{i}": driver._fresh_context() for i in range(6)}
    driver.generation = dict.fromkeys(driver.contexts, 0)
    return driver


@pytest.mark.parametrize("policy", ["tenure", "tenure-lru"])
def test_calls_from_two_threads_under_the_manager_lock_keep_the_contract(policy: str) -> None:
    from tenure.engine_adapter.manager import TenureOffloadingManager
    from tenure.engine_adapter.testing.contract import instrument
    from tenure.service.wire.push import Decision, SessionState

    manager = instrument(TenureOffloadingManager(num_chunks=12, cache_policy=policy))
    lock_of: AbstractContextManager[Any] = getattr(manager, "lock", nullcontext())
    # 0.33's stand-alone CPU manager is entered by the scheduler thread only: its lock is a
    # no-op context, which the tiering manager around it replaces with a real one.
    assert hasattr(lock_of, "__enter__")
    lock = threading.Lock()
    target = One(manager)
    drivers = [_driver(target, 1, "a", 0), _driver(target, 2, "b", 10**6)]
    errors: list[BaseException] = []
    stop = threading.Event()
    entered: set[str] = set()

    def schedule(driver: Driver) -> None:
        try:
            for _ in range(600):
                # One scheduler step holds the lock across its calls (a lookup HIT and the
                # prepare_load that pins it must not be split by the other thread's eviction).
                with lock:
                    entered.add(threading.current_thread().name)
                    driver.step()
        except BaseException as exc:
            errors.append(exc)

    def push() -> None:
        # The push channel's thread: appends decisions only, never calls the manager.
        rng, seq = random.Random(3), 0
        while not stop.is_set():
            seq += 1
            session = f"{rng.choice('ab')}{rng.randrange(6)}.0"
            state: SessionState = rng.choice(["idle", "suspended", "finished"])
            decision = Decision(seq=seq, session_id=session, state=state, expected_gap_s=1.0)
            manager.tenure.inbox.append(decision)
            stop.wait(0.002)

    threads = [threading.Thread(target=schedule, args=(d,), name=f"sched-{i}")
               for i, d in enumerate(drivers)]  # fmt: skip
    pusher = threading.Thread(target=push, name="push")
    pusher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    stop.set()
    pusher.join(timeout=10)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in threads)
    assert entered == {"sched-0", "sched-1"}
    # Both threads' traffic reached the policy, and it stored and evicted under pressure.
    stats = manager.tenure.stats
    assert sum(d.counts.get("prepare_store", 0) for d in drivers) > 100
    assert stats["stores"] > 0
