"""The adapter policy's key <-> session mapping, through vLLM's real offloading managers.

No engine: the managers (vLLM's ``CPUOffloadingManager`` and Tenure's subclass) are driven with
the calls the offloading scheduler makes, and the books are checked against each other after
every step: vLLM's chunk pool, the policy's chunks, the core tier's residency.
"""

from __future__ import annotations

import random
from typing import Any, cast

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

BLOCK = 16


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    from tenure.engine_adapter.plugin import register

    register()


def key(owner: int, index: int) -> Any:
    return (owner * 10_000 + index + 1).to_bytes(32, "big") + b"\0\0\0\0"


def make_ctx(req_id: str, keys: list[Any], tags: dict[str, Any] | None) -> Any:
    from vllm.v1.kv_offload.base import ReqContext

    ctx = ReqContext(req_id=req_id, kv_transfer_params={"tenure": tags} if tags else None)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, (i + 1) * BLOCK)
    return ctx


def tenure_manager(capacity: int, policy: str = "tenure"):
    from tenure.engine_adapter.manager import TenureOffloadingManager

    return TenureOffloadingManager(num_chunks=capacity, cache_policy=policy, block_tokens=BLOCK)


def serve(
    manager: Any,
    req_id: str,
    keys: list[Any],
    tags: dict[str, Any] | None = None,
    *,
    gpu_hit: int = 0,
) -> bool:
    """One request as the scheduler drives it: lookup/load the hit prefix past the first
    ``gpu_hit`` blocks (the GPU prefix cache's), store the rest, complete the transfers,
    finish. Returns whether the store was admitted."""
    ctx = make_ctx(req_id, [], tags)
    manager.on_new_request(ctx)
    for i, k in enumerate(keys):  # vLLM hashes the blocks after on_new_request
        ctx.set_offload_key_position(k, (i + 1) * BLOCK)
    hit = 0
    for k in keys[gpu_hit:]:
        if manager.lookup(k, ctx).name != "HIT":
            break
        hit += 1
    loaded = keys[gpu_hit : gpu_hit + hit]
    if hit:
        manager.prepare_load(loaded, ctx)
        manager.complete_load(loaded, ctx)
    rest = keys[gpu_hit + hit :]
    out = manager.prepare_store(rest, ctx) if rest else None
    if out is not None:
        manager.complete_store(out.keys_to_store, ctx)
    manager.on_request_finished(ctx)
    return out is not None


def check_books(manager) -> None:
    policy = manager._policy
    allocated = manager._num_allocated_chunks - len(manager._free_list)
    assert allocated == len(policy.chunks), "vLLM's pool and the policy disagree"
    from tenure.engine_adapter.policy import TenureCachePolicy

    tenure = policy if isinstance(policy, TenureCachePolicy) else None
    if tenure is None:
        return
    resident = [k for k in tenure.chunks if k in tenure.key_map.loc]
    # Under vLLM's stock manager an offer the manager dropped before evict() stays staged
    # until the next offer rolls it back; Tenure's manager rolls it back at once.
    staged = [k for k in tenure.holdings.staged if k not in tenure.chunks]
    if getattr(manager, "tenure", None) is not None:
        assert not staged
    assert tenure.tier.used == len(resident) + len(staged)
    assert set(tenure.chunks) == set(resident) | set(tenure.holdings.doomed)
    for k in resident + staged:
        seg, index = tenure.key_map.loc[k]
        assert tenure.tier.is_resident(seg, index)


def test_last_turn_reclaims_own_blocks_but_a_live_sharer_inherits_the_prefix():
    manager = tenure_manager(capacity=32)
    policy = manager.tenure
    system = [key(0, i) for i in range(2)]
    a = system + [key(1, i) for i in range(2, 5)]
    b = system + [key(2, i) for i in range(2, 4)]
    serve(manager, "a1", a, {"session_id": "A", "expected_gap_ms": 1000})
    serve(manager, "b1", b, {"session_id": "B", "expected_gap_ms": 1000})
    assert policy.resident_blocks("A") == 5 and policy.resident_blocks("B") == 2
    serve(manager, "a2", a, {"session_id": "A", "last_turn": True})
    check_books(manager)
    assert policy.resident_blocks("A") == 0
    # B still uses the shared system prompt: it now owns it instead of losing it.
    assert policy.resident_blocks("B") == 4
    assert all(manager.lookup(k, make_ctx("q", b, None)).name == "HIT" for k in b)
    assert policy.stats["inherited_blocks"] == 2
    assert policy.stats["evicted_blocks_reclaim"] == 3


def test_same_position_different_content_forks_the_segment():
    manager = tenure_manager(capacity=32)
    policy = manager.tenure
    first = [key(1, i) for i in range(3)]
    edited = [key(1, 0), key(9, 1), key(9, 2)]  # the context was edited after block 0
    serve(manager, "r1", first, {"session_id": "S"})
    serve(manager, "r2", edited, {"session_id": "S"})
    check_books(manager)
    assert policy.resident_blocks("S") == 5
    assert all(policy.get(k) is not None for k in first + edited)


def test_reclaim_of_a_block_being_loaded_waits_for_the_load():
    manager = tenure_manager(capacity=8)
    policy = manager.tenure
    keys = [key(1, i) for i in range(3)]
    serve(manager, "r1", keys, {"session_id": "S", "expected_gap_ms": 1000})
    ctx = make_ctx("r2", keys, {"session_id": "S", "last_turn": True})
    manager.on_new_request(ctx)
    manager.prepare_load(keys, ctx)  # pinned by an in-flight load
    manager.on_request_finished(ctx)  # the last turn finishes while its load is in flight
    check_books(manager)
    assert all(policy.get(k) is not None for k in keys), "a pinned chunk must not be freed"
    manager.complete_load(keys, ctx)
    check_books(manager)
    assert all(policy.get(k) is None for k in keys)
    assert manager._get_num_free_chunks() == 8


def test_untagged_continuation_is_inferred_by_prefix_chain():
    manager = tenure_manager(capacity=32)
    policy = manager.tenure
    system = [key(0, i) for i in range(2)]
    convo = system + [key(1, i) for i in range(2, 4)]
    serve(manager, "u1", convo)
    (anon,) = [s for s, _ in policy.tier.resident_sessions()]
    serve(manager, "u2", [*convo, key(1, 4), key(1, 5)])  # the same conversation, next turn
    assert policy.resident_blocks(anon) == 6
    other = system + [key(2, i) for i in range(2, 4)]  # shares only the system prompt
    serve(manager, "u3", other)
    assert len(list(policy.tier.resident_sessions())) == 2
    check_books(manager)


@pytest.mark.parametrize(
    "policy_name", ["tenure", "tenure-lru", "tenure-tags-off", "ttl", "tenure-density"]
)
def test_random_traffic_keeps_books_consistent(policy_name):
    rng = random.Random(policy_name)
    manager = tenure_manager(capacity=24, policy=policy_name)
    contexts: dict[int, list[bytes]] = {}
    serial = 0
    for step in range(400):
        slot = rng.randrange(8)
        if slot not in contexts or rng.random() < 0.1:
            serial += 1
            contexts[slot] = [key(0, 0), key(serial, 1)]
        ctx_keys = contexts[slot]
        ctx_keys += [key(serial * 100 + slot, len(ctx_keys) + j) for j in range(rng.randint(1, 4))]
        tags = None
        if rng.random() < 0.8:
            tags = {"session_id": f"s{slot}-{serial}", "expected_gap_ms": rng.randint(0, 60000)}
            if rng.random() < 0.15:
                tags["last_turn"] = True
        serve(manager, f"r{step}", ctx_keys[:40], tags)
        if tags and tags.get("last_turn"):
            contexts.pop(slot)
        check_books(manager)


def test_stock_manager_with_tenure_policy_stays_consistent():
    """``eviction_policy: tenure`` under vLLM's stock manager (no out-of-band frees)."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    rng = random.Random(5)
    manager = CPUOffloadingManager(num_chunks=16, cache_policy="tenure")
    policy: Any = manager._policy
    for step in range(200):
        owner = rng.randrange(6)
        keys = [key(owner, i) for i in range(rng.randint(1, 6))]
        tags = {"session_id": f"s{owner}", "expected_gap_ms": 5000}
        if rng.random() < 0.2:
            tags["last_turn"] = True
        serve(manager, f"r{step}", keys, tags)
        check_books(manager)
        assert len(policy.chunks) <= 16


def test_per_session_tables_stay_bounded(monkeypatch):
    import tenure.engine_adapter.pushed as module

    monkeypatch.setattr(module, "_PRUNE_ABOVE", 50)
    manager = tenure_manager(capacity=8)
    policy = manager.tenure
    for i in range(400):
        serve(manager, f"r{i}", [key(i, 0)], {"session_id": f"s{i}", "expected_gap_ms": 1000})
        if i % 7 == 0:
            serve(manager, f"e{i}", [key(i, 0)], {"session_id": f"s{i}", "last_turn": True})
    for _ in range(1024):
        policy.poll()
    assert len(policy.sessions.last_hint) <= 50 + 8
    assert len(policy.sessions.ended) <= 50 + 8
    check_books(manager)


def test_vllm_033_insert_with_request_context_maps_the_key_to_its_session() -> None:
    """vLLM 0.33 calls ``insert(key, chunk, req_context)`` (0.32: ``insert(key, chunk)``); a
    block inserted without a prior gate decision is placed in the context's session."""
    from vllm.v1.kv_offload.cpu.policies.base import ChunkStatus

    from tenure.engine_adapter.policies import policy_class_for

    policy = policy_class_for("tenure")(cache_capacity=8)
    policy.block_tokens = BLOCK
    keys = [key(7, i) for i in range(3)]
    ctx = make_ctx("r-033", keys, {"session_id": "s-033"})
    for n, k in enumerate(keys):
        chunk = ChunkStatus(n)
        policy.insert(k, chunk, ctx)
        chunk.ref_cnt = 0
        policy.mark_evictable(k)
    assert policy.resident_blocks("s-033") == 3
    policy.insert(key(8, 0), ChunkStatus(9))  # the 0.32 signature still works
    assert len(policy.chunks) == 4


def _start(manager: Any, req_id: str, keys: list[Any], tags: dict[str, Any]) -> Any:
    """A request reaches the scheduler (``on_new_request``) and waits in its queue."""
    ctx = make_ctx(req_id, [], tags)
    manager.on_new_request(ctx)
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, (i + 1) * BLOCK)
    return ctx


def _resident(manager: Any, keys: list[Any]) -> int:
    return sum(manager.lookup(k, make_ctx("probe", [], None)).name == "HIT" for k in keys)


@pytest.mark.parametrize("admitted_first", [False, True])
def test_a_queued_session_gives_way_to_a_denser_store_until_the_engine_admits_it(
    admitted_first: bool,
) -> None:
    """tenure-density through Tenure's manager: session q's next request waits in the queue
    (vLLM told the policy of it, nothing looked up or stored yet); session d, due back in
    seconds, stores ten new blocks into a full tier. q's copy (its next gap expected an hour)
    gives way. Once the engine has admitted q's request (it loaded its copy), the same store
    is refused: the copy of a running request is off limits."""
    manager = tenure_manager(capacity=30, policy="tenure-density")
    q_keys = [key(1, i) for i in range(10)]
    d_keys = [key(2, i) for i in range(30)]
    assert serve(manager, "q1", q_keys, {"session_id": "q", "expected_gap_ms": 3_600_000})
    assert serve(manager, "d1", d_keys[:20], {"session_id": "d", "expected_gap_ms": 5_000})
    assert _resident(manager, q_keys) == 10
    q2 = _start(
        manager, "q2", [*q_keys, key(1, 10)], {"session_id": "q", "expected_gap_ms": 3_600_000}
    )
    if admitted_first:
        for k in q_keys:
            assert manager.lookup(k, q2).name == "HIT"
        manager.prepare_load(q_keys, q2)
        manager.complete_load(q_keys, q2)
    stored = serve(manager, "d2", d_keys, {"session_id": "d", "expected_gap_ms": 5_000})
    check_books(manager)
    if admitted_first:
        assert not stored and _resident(manager, q_keys) == 10
    else:
        assert stored and _resident(manager, q_keys) == 0
        assert manager.tenure.tier.counters["evicted_blocks_utility"] == 10
    manager.on_request_finished(q2)
    check_books(manager)


def test_each_admitted_request_tells_the_core_what_its_lookup_found() -> None:
    """As the replay does at admission: the blocks looked up past the GPU hit and the host hit
    among them, once per request. tenure-density's allocation clock counts what was computed,
    and its yield learns what share of a held copy the next turn loaded."""
    manager = tenure_manager(capacity=64, policy="tenure-density")
    core = manager.tenure.core
    core.yields.min_samples = 1  # read the yield from the first observation on
    keys = [key(1, i) for i in range(14)]
    tags: dict[str, Any] = {"session_id": "S", "expected_gap_ms": 30_000}
    assert serve(manager, "r1", keys[:10], tags)  # cold: 10 looked up, none found
    assert core.clock == 10
    # The GPU still holds 6 blocks: the lookup starts at block 6, finds 4 held (6-9) and the
    # request computes 4 (10-13). 4 of the 10 held blocks were loaded, at clock distance 0.
    assert serve(manager, "r2", keys, tags, gpu_hit=6)
    assert core.clock == 14
    assert core.yields.of(0.0) == pytest.approx(0.4)
    # The GPU holds all 14 blocks of the copy: the lookup starts at the turn's new block (a
    # miss), which the request computes; none of the copy was loaded.
    assert serve(manager, "r3", [*keys, key(1, 14)], tags, gpu_hit=14)
    assert core.clock == 15
    assert core.yields.of(0.0) == pytest.approx(0.2)  # the mean of 0.4 and 0


def test_the_stock_manager_reports_no_lookups_to_the_core() -> None:
    """vLLM's own manager does not pass its lookups on: the core hears none, rather than a
    request the GPU served whole each time."""
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

    manager = CPUOffloadingManager(num_chunks=64, cache_policy="tenure-density")
    core = cast(Any, manager._policy).core
    core.yields.min_samples = 1
    keys = [key(1, i) for i in range(10)]
    tags = {"session_id": "S", "expected_gap_ms": 30_000}
    serve(manager, "r1", keys, tags)
    serve(manager, "r2", keys, tags)
    assert core.clock == 0 and core.yields.of(0.0) == 1.0
