"""The ``CachePolicy`` contract as executable checks, around vLLM's real offloading managers.

Used by the suite's contract fuzz (``tests/engine/test_contract_fuzz.py``) and by the runner of
vLLM's own offloading tests (``scripts/run_vllm_offload_tests.sh``). :func:`instrument` wraps a
live manager so that, after every call the scheduler (or a test) makes, :func:`check_books`
verifies what vLLM's manager and the policy must agree on, and every ``evict`` is checked
against the contract in ``vllm/v1/kv_offload/cpu/policies/base.py``: exactly ``n`` idle chunks,
none of them protected, and on ``None`` no change at all. A breach raises
:class:`ContractViolation` (an ``AssertionError``, so pytest shows it as a failure) and is also
appended to ``manager.contract_violations``, so a caller can tell a breach from a test's own
expectation failing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tenure.engine_adapter.vllm_compat import manager_policy, num_evictable_chunks

__all__ = ["MANAGER_CALLS", "ContractViolation", "check_books", "instrument"]

#: The manager entry points checked after each call.
MANAGER_CALLS = (
    "on_new_request",
    "lookup",
    "prepare_load",
    "complete_load",
    "touch",
    "prepare_store",
    "complete_store",
    "on_request_finished",
    "on_schedule_end",
    "reset_cache",
)


class ContractViolation(AssertionError):
    """The policy or the manager's books broke the ``CachePolicy`` contract."""


def _fail(manager: Any, what: str) -> None:
    violations: list[str] | None = getattr(manager, "contract_violations", None)
    if violations is not None:
        violations.append(what)
    raise ContractViolation(what)


def check_books(manager: Any) -> None:
    """vLLM's chunk pool, its reference counts and the policy's books agree (else raise)."""
    from tenure.engine_adapter.policy import TenureCachePolicy

    policy = manager_policy(manager)
    if not isinstance(policy, TenureCachePolicy):
        return
    chunks = policy.chunks
    allocated = manager._num_allocated_chunks - len(manager._free_list)
    if allocated > manager._num_chunks:
        _fail(manager, f"overrun: {allocated} chunks allocated of {manager._num_chunks}")
    if allocated != len(chunks):
        _fail(manager, f"pool holds {allocated} chunks, the policy {len(chunks)}")
    ids = [c.chunk_id for c in chunks.values()]
    if len(set(ids)) != len(ids) or set(ids) & set(manager._free_list):
        _fail(manager, "a chunk id is held twice or held and free")
    idle = sum(1 for c in chunks.values() if c.ref_cnt == 0)
    counted = num_evictable_chunks(manager)
    if counted != idle:
        _fail(manager, f"manager counts {counted} idle, {idle} are")
    pending = sum(1 for c in chunks.values() if c.ref_cnt < 0)
    if manager._num_write_pending_chunks != pending:
        _fail(manager, f"manager counts {manager._num_write_pending_chunks} pending, {pending} are")
    pinned = {k for k, c in chunks.items() if c.ref_cnt != 0}
    if policy.holdings.pinned != pinned:
        _fail(manager, f"policy pins {len(policy.holdings.pinned)} keys, {len(pinned)} are pinned")
    tier = policy.tier
    if tier.capacity is not None and tier.used > tier.capacity:
        _fail(manager, f"tier overrun: {tier.used} of {tier.capacity}")
    if tier.used != sum(tier.session_resident.values()):
        _fail(manager, "tier's per-session counts do not add up")
    loc = policy.key_map.loc
    doomed = set(policy.holdings.doomed)
    if not doomed <= chunks.keys():
        _fail(manager, "a doomed key is not held by vLLM")
    resident = {k for k in chunks if k in loc}
    if resident & doomed:
        _fail(manager, "a key is both resident and doomed")
    if resident | doomed != chunks.keys():
        lost = len(chunks.keys() - resident - doomed)
        _fail(manager, f"{lost} chunk(s) held by vLLM are neither in the tier nor doomed")
    staged_only = {k for k in policy.holdings.staged if k not in chunks}
    if not staged_only <= loc.keys() or loc.keys() != resident | staged_only:
        _fail(manager, "the key map holds keys that are neither held nor staged")
    if tier.used != len(resident) + len(staged_only):
        _fail(
            manager,
            f"tier counts {tier.used} blocks, vLLM holds {len(resident)} of its keys "
            f"(+{len(staged_only)} staged)",
        )
    slots = 0
    for key_at in policy.key_map.key_at:
        slots += sum(1 for k in key_at if k is not None)
    if slots != len(loc):
        _fail(manager, f"{len(loc)} keys mapped onto {slots} slots (one key per slot)")
    for key, (seg, index) in loc.items():
        if policy.key_map.key_at[seg][index] != key or not tier.is_resident(seg, index):
            _fail(manager, f"key at ({seg}, {index}) is not where the tier counts it")
    if getattr(manager, "tenure", None) is not None and (doomed - pinned):
        # Tenure's manager frees what the policy dropped at once; only pinned chunks wait.
        _fail(manager, f"{len(doomed - pinned)} idle doomed chunk(s) were not freed")


def _checked_evict(manager: Any, evict: Callable[..., Any]) -> Callable[..., Any]:
    policy = manager_policy(manager)

    @functools.wraps(evict)
    def wrapper(n: int, protected: set[Any]) -> Any:
        before = dict(policy.chunks)
        out = evict(n, protected)
        if out is None:
            if dict(policy.chunks) != before or any(
                policy.chunks[k] is not c for k, c in before.items()
            ):
                _fail(manager, "evict() returned None but changed the chunks")
            return out
        keys = [k for k, _ in out]
        if len(keys) != n or len(set(keys)) != n:
            _fail(manager, f"evict({n}) returned {len(keys)} chunks ({len(set(keys))} distinct)")
        if set(keys) & protected:
            _fail(manager, f"evict() returned {len(set(keys) & protected)} protected key(s)")
        for key, chunk in out:
            if before.get(key) is not chunk:
                _fail(manager, "evict() returned a chunk the policy did not hold")
            if chunk.ref_cnt != 0:
                _fail(manager, f"evict() returned a chunk in use (ref_cnt {chunk.ref_cnt})")
            if key in policy.chunks:
                _fail(manager, "evict() returned a chunk it still holds")
        return out

    return wrapper


def _checked_call(manager: Any, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = call(*args, **kwargs)
        check_books(manager)
        return out

    return wrapper


def instrument(manager: Any) -> Any:
    """Check ``manager`` (a ``CPUOffloadingManager`` with a Tenure policy) after every call."""
    manager.contract_violations = []
    policy = manager_policy(manager)
    policy.evict = _checked_evict(manager, policy.evict)
    for name in MANAGER_CALLS:
        setattr(manager, name, _checked_call(manager, name, getattr(manager, name)))
    check_books(manager)
    return manager
