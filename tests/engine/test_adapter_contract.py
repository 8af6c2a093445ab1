"""The five ``CachePolicy`` contract defects vLLM's own offloading tests exposed, one test each.

Each drives vLLM's real managers (stock ``CPUOffloadingManager`` and ``TenureOffloadingManager``)
with the calls that broke the contract, under
:func:`tenure.engine_adapter.testing.contract.instrument` (books, reference counts and ``evict``'s
contract checked after every call):

1. a request active across ``reset_cache()`` stores again (crashed: ``IndexError``);
2. a session storing behind another session's prefix never evicts that prefix (``evict``
   returned protected keys);
3. a second context edit gets its own slots (it overwrote the first edit's, so the tier
   counted fewer chunks than vLLM held and one stayed held after the last turn);
4. a store vLLM could not place, then a last-turn reclaim (``KeyError`` at the next store);
5. offers vLLM's store threshold filters out never reach the gate (refusals counted for stores
   that never happened; ``tenure-lru`` then evicted the wrong block).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadKey

from tests.engine.offload_driver import BLOCK, key

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

MANAGERS = ["stock", "tenure"]


@pytest.fixture(scope="module", autouse=True)
def _plugin() -> None:
    from tenure.engine_adapter.plugin import register

    register()


def manager_for(kind: str, capacity: int, policy: str = "tenure", threshold: int = 0) -> Any:
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    from tenure.engine_adapter.manager import TenureOffloadingManager
    from tenure.engine_adapter.testing.contract import instrument

    cls = TenureOffloadingManager if kind == "tenure" else CPUOffloadingManager
    return instrument(cls(num_chunks=capacity, cache_policy=policy, store_threshold=threshold))


def request(req_id: str, keys: list[OffloadKey], **tags: Any) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=req_id, kv_transfer_params={"tenure": tags} if tags else None)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, (i + 1) * BLOCK)
    return ctx


def turn(manager: Any, ctx: Any, keys: list[OffloadKey]) -> Any:
    """Store ``keys`` for ``ctx`` (one offer), complete the transfer, finish the request."""
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys, ctx)
    if out is not None and out.keys_to_store:
        manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    return out


def free_chunks(manager: Any) -> int:
    return int(manager._get_num_free_chunks())


@pytest.mark.parametrize("kind", MANAGERS)
def test_request_active_across_reset_cache_stores_again_from_chunk_zero(kind: str) -> None:
    """vLLM keeps running requests across a prefix-cache reset and re-offloads them from
    chunk 0; the policy's per-request state from before the reset must not be trusted."""
    manager = manager_for(kind, capacity=8)
    policy = manager._policy
    keys = [key(i) for i in range(1, 5)]
    ctx = request("r1", keys, session_id="S", expected_gap_ms=5000)
    manager.on_new_request(ctx)
    out = manager.prepare_store(keys[:2], ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    generation = getattr(policy, "generation", 0)

    manager.reset_cache()
    assert free_chunks(manager) == 8 and not policy.chunks
    out = manager.prepare_store(keys, ctx)  # the same, still running request
    assert out is not None and out.keys_to_store == keys
    manager.complete_store(keys, ctx)
    manager.on_request_finished(ctx)
    assert policy.resident_blocks("S") == 4
    assert free_chunks(manager) == 4
    assert policy.generation == generation + 1


@pytest.mark.parametrize("kind", MANAGERS)
@pytest.mark.parametrize("policy_name", ["tenure", "tenure-lru", "ttl", "mori", "marconi"])
def test_a_shared_prefix_is_never_evicted_for_the_store_behind_it(
    kind: str, policy_name: str
) -> None:
    """B offers A's stored prefix plus its own tail to a full tier: the prefix is protected
    (vLLM never evicts a key of the offer), so the store is refused or evicts something else;
    B's tail never sits behind a missing prefix block."""
    manager = manager_for(kind, capacity=3, policy=policy_name)
    prefix = [key(1), key(2)]
    a_tail = [key(3)]
    turn(
        manager,
        request("a1", prefix + a_tail, session_id="A", expected_gap_ms=600_000),
        prefix + a_tail,
    )
    b_keys = [*prefix, key(10), key(11)]
    out = turn(manager, request("b1", b_keys, session_id="B", expected_gap_ms=1000), b_keys)
    assert not manager.contract_violations
    if out is not None:
        assert not set(out.evicted_keys) & set(b_keys)
    for k in prefix:
        assert manager._policy.get(k) is not None, "a protected prefix block was evicted"


@pytest.mark.parametrize("kind", MANAGERS)
def test_a_second_context_edit_gets_its_own_slots(kind: str) -> None:
    """Three versions of one session's context that differ from block 1 on (two edits), the
    last request editing twice: every chunk vLLM holds is counted once by the tier, and the
    last turn frees all of them."""
    manager = manager_for(kind, capacity=32)
    policy = manager._policy
    base = [key(1), key(2), key(3)]
    first_edit = [key(1), key(20), key(21)]
    second_edit = [key(1), key(30), key(31)]
    for n, keys in enumerate([base, first_edit, second_edit]):
        turn(manager, request(f"r{n}", keys, session_id="S", expected_gap_ms=5000), keys)
    assert policy.resident_blocks("S") == 7
    # One request, two edits: its context diverges at block 1, then again at block 3.
    twice = [key(1), key(40), key(41), key(42)]
    ctx = request("r3", twice, session_id="S", expected_gap_ms=5000)
    manager.on_new_request(ctx)
    for part in (twice[:3], twice[3:]):
        out = manager.prepare_store(part, ctx)
        assert out is not None
        manager.complete_store(out.keys_to_store, ctx)
    again = [key(1), key(40), key(41), key(50)]
    ctx.set_offload_key_position(key(50), 4 * BLOCK)
    out = manager.prepare_store(again[3:], ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    assert policy.resident_blocks("S") == len(policy.chunks) == 11
    turn(manager, request("r4", base, session_id="S", last_turn=True), base)
    if kind == "tenure":
        assert free_chunks(manager) == 32, "a chunk stayed held after the last turn"
    else:
        # The stock manager frees reclaimed chunks at the next store: all are evictable.
        assert policy.resident_blocks("S") == 0
        assert set(policy.holdings.doomed) == set(policy.chunks)


def test_a_store_vllm_could_not_place_survives_a_reclaim() -> None:
    """Stock manager: with the room pinned by loads, vLLM drops a store the gate would admit
    (it never asks for victims); the storing session's last turn then reclaims; the next
    store must work (it raised ``KeyError`` on the staged key's dropped slot)."""
    manager = manager_for("stock", capacity=4)
    policy = manager._policy
    a_keys = [key(i) for i in range(1, 5)]
    turn(manager, request("a1", a_keys, session_id="A", expected_gap_ms=1000), a_keys)
    # A's last turn loads its blocks (pinned) and finishes while the load is in flight.
    a_last = request("a2", a_keys, session_id="A", last_turn=True)
    manager.on_new_request(a_last)
    manager.prepare_load(a_keys, a_last)
    manager.on_request_finished(a_last)
    assert policy.resident_blocks("A") == 0  # reclaimed; the chunks wait for the load

    b_keys = [key(10)]
    b = request("b1", b_keys, session_id="B", last_turn=True)
    manager.on_new_request(b)
    assert manager.prepare_store(b_keys, b) is None  # no evictable room in vLLM's pool
    manager.on_request_finished(b)  # B's last turn: reclaim

    c_keys = [key(20)]
    c = request("c1", c_keys, session_id="C", expected_gap_ms=1000)
    manager.on_new_request(c)
    assert manager.prepare_store(c_keys, c) is None  # still pinned: refused, no crash
    manager.complete_load(a_keys, a_last)
    out = manager.prepare_store(c_keys, c)
    assert out is not None and out.keys_to_store == c_keys
    assert set(out.evicted_keys) <= set(a_keys)  # the reclaimed chunks go first
    manager.complete_store(c_keys, c)
    manager.on_request_finished(c)
    assert policy.resident_blocks("C") == 1


def test_offers_the_store_threshold_filters_never_reach_the_gate() -> None:
    """``store_threshold`` 2: a block is stored the second time it is offered. A first offer
    stores nothing, so the gate must not count a refusal or pick victims for it."""
    manager = manager_for("tenure", capacity=2, threshold=2)
    policy = manager._policy
    resident = [key(1), key(2)]
    ctx = request("r1", resident, session_id="R", expected_gap_ms=5000)
    manager.on_new_request(ctx)
    for _ in range(2):
        out = manager.prepare_store(resident, ctx)
    assert out is not None and out.keys_to_store == resident
    manager.complete_store(resident, ctx)
    manager.on_request_finished(ctx)

    newcomer = request("n1", [key(5)], session_id="N", expected_gap_ms=600_000)
    manager.on_new_request(newcomer)
    out = manager.prepare_store([key(5)], newcomer)  # first offer: vLLM stores nothing
    assert out is not None and out.keys_to_store == []
    assert policy.stats["refusals"] == 0
    assert policy.core.counters["refusals"] == 0 and policy.tier.counters["refusals"] == 0


def test_threshold_filtered_offer_leaves_lru_order_as_vllm_has_it() -> None:
    """``tenure-lru`` under Tenure's manager with ``store_threshold`` 2, beside vLLM's LRU: a
    filtered first offer must not re-rank anything, so both evict the same block next."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    ours = manager_for("tenure", capacity=2, policy="tenure-lru", threshold=2)
    theirs = CPUOffloadingManager(num_chunks=2, cache_policy="lru", store_threshold=2)
    head, tail, newcomer = key(1), key(2), key(3)
    evicted: list[list[Any]] = []
    for manager in (theirs, ours):
        ctx = request("r1", [head, tail])
        manager.on_new_request(ctx)
        for _ in range(2):
            out = manager.prepare_store([head, tail], ctx)
        manager.complete_store([head, tail], ctx)
        manager.on_request_finished(ctx)  # head most recent, tail least
        n = request("n1", [newcomer])
        manager.on_new_request(n)
        first = manager.prepare_store([newcomer], n)  # filtered: nothing stored
        assert first is not None and first.keys_to_store == []
        out = manager.prepare_store([newcomer], n)  # second offer: stored, evicts one
        assert out is not None and out.keys_to_store == [newcomer]
        evicted.append(list(out.evicted_keys))
    assert evicted[0] == [tail]
    assert evicted[1] == evicted[0]


def test_every_registered_policy_resolves_by_name_and_builds_a_manager() -> None:
    """The plugin's names resolve through vLLM's own factory to ``CachePolicy`` classes that
    both managers build, and vLLM's built-in ``lru`` / ``arc`` keep theirs."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
    from vllm.v1.kv_offload.cpu.policies.lru import LRUCachePolicy

    from tenure.engine_adapter.manager import TenureOffloadingManager
    from tenure.engine_adapter.plugin import register, registered_policy_names
    from tenure.engine_adapter.policy import TenureCachePolicy

    register()  # idempotent: a second registration changes nothing
    names = registered_policy_names()
    assert {"tenure", "tenure-lru", "tenure-arc"} <= set(names)
    assert "lru" not in names and "arc" not in names
    assert CachePolicyFactory.get_cache_policy_cls("lru") is LRUCachePolicy
    for vllm_name, core_name in names.items():
        cls = CachePolicyFactory.get_cache_policy_cls(vllm_name)
        assert issubclass(cls, CachePolicy) and issubclass(cls, TenureCachePolicy)
        assert cls.core_name == core_name
        for manager_cls in (CPUOffloadingManager, TenureOffloadingManager):
            manager = manager_cls(num_chunks=4, cache_policy=vllm_name)
            assert type(manager._policy) is cls
