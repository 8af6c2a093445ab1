"""The adapter inside a real vLLM engine (CPU build, tiny random-weight model, in-process).

Block geometry: the CPU backend's KV block is 128 tokens; every prompt here has 300 tokens, so
it offloads 2 full blocks. The engine's own pool holds 5 blocks and the host tier 6, so three
other prompts flood a session out of the engine and fill the host tier.
"""

from __future__ import annotations

import time

import pytest

from tenure.engine_adapter.testing.engine import live_manager
from tenure.service.tools.tiny_model import word_prompt
from tests.engine.conftest import HOST_BLOCKS, generate, metric, settle
from tests.engine.router_peer import RouterPeer, reports

pytestmark = pytest.mark.engine

PROMPT_TOKENS = 300
BLOCKS_PER_PROMPT = 2
FAST_CHANNEL = {"tenure_report_interval_s": 0.2, "tenure_hello_interval_s": 0.5}


def prompt(seed: int) -> str:
    return word_prompt(seed, PROMPT_TOKENS)


def flood_scenario(llm) -> tuple[list[int], float]:
    """Session A's turn, three unrelated prompts, then A's next turn on the same prefix.

    Returns A's second-turn tokens and the external (host-tier) prefix hits that turn got.
    """
    a = prompt(1)
    generate(llm, a, {"session_id": "A", "turn": 1, "expected_gap_ms": 5000})
    for seed in (101, 102, 103):
        generate(llm, prompt(seed))  # untagged traffic from other clients
    settle(llm)
    before = metric(llm, "vllm:external_prefix_cache_hits")
    tokens = generate(llm, a + " w7 w8 w9", {"session_id": "A", "turn": 2})
    return tokens, metric(llm, "vllm:external_prefix_cache_hits") - before


def test_flooded_prefix_served_from_host_under_tenure_not_lru(engines, router: RouterPeer):
    # Baseline: vLLM's own LRU policy and manager on the same host-copy path.
    lru = engines.get("lru", spec="CPUHostOffloadingSpec")
    recomputed, lru_hits = flood_scenario(lru)
    assert lru_hits == 0, "under LRU the flood should have evicted A's prefix from the host tier"

    llm = engines.get("tenure", push_addr=router.addr, extra=FAST_CHANNEL)
    manager = live_manager(llm)
    loads_before = manager.tenure.stats["host_hit_blocks"]
    served, tenure_hits = flood_scenario(llm)
    assert tenure_hits >= BLOCKS_PER_PROMPT * 128
    assert manager.tenure.stats["host_hit_blocks"] - loads_before >= BLOCKS_PER_PROMPT
    # The KV loaded from the host reproduces exactly what recomputing the prefix gives.
    assert served == recomputed
    # The gate refused the newcomer that found the tier full, instead of evicting A.
    assert manager.tenure.stats["refusals"] >= 1
    assert manager.tenure.resident_blocks("A") == BLOCKS_PER_PROMPT


def test_the_engines_lookups_reach_the_core_once_per_request(engines):
    """tenure-density in a real engine: vLLM's key-by-key lookups and loads reach the core at
    each request's admission, as the replay reports them. Its allocation clock counts exactly
    the blocks the engine computed: five prompts of two full blocks, less the GPU's and the
    host tier's hits."""
    llm = engines.get("tenure-density")
    manager = live_manager(llm)
    core = manager.tenure.core
    clock, loaded = core.clock, manager.tenure.stats["host_hit_blocks"]
    gpu_hits = metric(llm, "vllm:prefix_cache_hits")
    flood_scenario(llm)
    settle(llm)
    gpu = int(metric(llm, "vllm:prefix_cache_hits") - gpu_hits) // 128
    host = manager.tenure.stats["host_hit_blocks"] - loaded
    assert core.clock - clock == 5 * BLOCKS_PER_PROMPT - gpu - host
    assert core.clock - clock > 0


def test_declared_last_turn_frees_host_blocks_at_once(engines, router: RouterPeer):
    llm = engines.get("tenure", push_addr=router.addr, extra=FAST_CHANNEL)
    manager = live_manager(llm)
    policy = manager.tenure
    b = prompt(2)
    generate(llm, b, {"session_id": "B", "turn": 1, "expected_gap_ms": 60000})
    settle(llm)
    assert policy.resident_blocks("B") == BLOCKS_PER_PROMPT
    free_before = manager._get_num_free_chunks()
    reclaimed_before = policy.stats["evicted_blocks_reclaim"]

    generate(llm, b + " w1 w2", {"session_id": "B", "turn": 2, "last_turn": True})
    # One engine step after the request finishes (what the engine's loop does at once).
    assert settle(llm, until=lambda: policy.resident_blocks("B") == 0, timeout=5)
    assert manager._get_num_free_chunks() == free_before + BLOCKS_PER_PROMPT
    assert policy.stats["evicted_blocks_reclaim"] - reclaimed_before == BLOCKS_PER_PROMPT


def test_full_tier_of_live_sessions_refuses_newcomer(engines, router: RouterPeer):
    llm = engines.get("tenure", push_addr=router.addr, extra=FAST_CHANNEL)
    policy = live_manager(llm).tenure
    residents = ["L1", "L2", "L3"]
    for seed, session in enumerate(residents, start=10):
        generate(llm, prompt(seed), {"session_id": session, "expected_gap_ms": 30000})
    settle(llm)
    assert policy.tier.used == HOST_BLOCKS
    refusals, refused_blocks = policy.stats["refusals"], policy.stats["refused_blocks"]

    tokens = generate(llm, prompt(20), {"session_id": "N", "expected_gap_ms": 600000})
    settle(llm)
    assert len(tokens) == 8  # served normally, only not kept on the host
    assert policy.stats["refusals"] > refusals
    assert policy.stats["refused_blocks"] - refused_blocks >= BLOCKS_PER_PROMPT
    assert policy.resident_blocks("N") == 0
    assert all(policy.resident_blocks(s) == BLOCKS_PER_PROMPT for s in residents)
    # The refusal reaches the sidecar in a residency report.
    assert router.wait_for(lambda: sum(r.refusals for r in reports(router)) > 0)


def test_suspended_session_discarded_when_pushed_ttl_expires(engines, router: RouterPeer):
    llm = engines.get("tenure", push_addr=router.addr, extra=FAST_CHANNEL)
    policy = live_manager(llm).tenure
    generate(llm, prompt(30), {"session_id": "S", "expected_gap_ms": 5000})
    settle(llm)
    assert policy.resident_blocks("S") == BLOCKS_PER_PROMPT
    assert router.wait_for(lambda: bool(router.identities()))
    applied = policy.stats["decisions_applied"]
    expiries, ttl_evicted = policy.stats["ttl_expiries"], policy.stats["evicted_blocks_ttl"]

    ttl = 2.0
    router.decide("S", "suspended", host_ttl_s=ttl, reason="approval wait")
    expires_at = time.time() + ttl
    # Applied on the engine thread at its next step: still resident, not before the TTL.
    assert settle(llm, until=lambda: policy.stats["decisions_applied"] > applied, timeout=5)
    settle(llm, until=lambda: time.time() > expires_at - 0.5, timeout=ttl)
    assert policy.resident_blocks("S") == BLOCKS_PER_PROMPT
    assert policy.stats["ttl_expiries"] == expiries
    assert policy.stats["evicted_blocks_ttl"] == ttl_evicted

    assert settle(llm, until=lambda: policy.resident_blocks("S") == 0, timeout=ttl + 5)
    assert time.time() >= expires_at - 0.05
    assert policy.stats["ttl_expiries"] == expiries + 1
    assert policy.stats["evicted_blocks_ttl"] == ttl_evicted + BLOCKS_PER_PROMPT
    assert router.wait_for(lambda: sum(r.ttl_expiries for r in reports(router)) >= 1)
    assert any(r.evicted_blocks.get("ttl", 0) > 0 for r in reports(router))


def test_without_sidecar_serving_works_and_gate_holds(engines, tiny_model):
    # The channel points at an address nobody listens on.
    from tests.conftest import free_port

    llm = engines.get("tenure", push_addr=f"tcp://127.0.0.1:{free_port()}", extra=FAST_CHANNEL)
    manager = live_manager(llm)
    policy = manager.tenure
    for seed, session in enumerate(["R1", "R2", "R3"], start=40):
        generate(llm, prompt(seed), {"session_id": session, "expected_gap_ms": 20000})
    settle(llm)
    assert policy.tier.used == HOST_BLOCKS
    refusals = policy.stats["refusals"]
    # Untagged traffic (tags-off: no session id, no hints) cannot displace live sessions.
    for seed in (50, 51):
        assert len(generate(llm, prompt(seed))) == 8
    settle(llm)
    assert policy.stats["refusals"] >= refusals + 2
    assert all(policy.resident_blocks(s) == BLOCKS_PER_PROMPT for s in ["R1", "R2", "R3"])
    client = manager.push_client
    assert client is not None and not client.connected
    assert client.counters["send_dropped"] > 0  # hellos and reports went nowhere, never queued
    assert policy.stats["decisions_applied"] == 0
