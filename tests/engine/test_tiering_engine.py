"""Placement enforced in a real vLLM engine: vLLM's tiering path with the ``tenure-fs`` tier.

CPU vLLM 0.32 with ``TenureCPUTieringSpec`` (the stock ``TieringOffloadingSpec`` with a host-copy
worker over its shared region) and one ``tenure-fs`` secondary tier in a temporary directory.
Requests go straight to the engine with the segment wire format in
``kv_transfer_params.tenure``. Block geometry: 128-token blocks; the primary (DRAM) tier and the
engine's own pool hold 6 blocks each, so two 3-block workers push the lead's blocks out of both
and its next turn is served from the files on disk.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from tenure.engine_adapter.placement_push import placement_delta
from tenure.engine_adapter.testing.engine import live_manager
from tests.engine.conftest import metric, settle

pytestmark = pytest.mark.engine

BLOCK = 128


@pytest.fixture(scope="module")
def fs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tenure-fs")


def tiered(engines: Any, root: Path) -> tuple[Any, Any, list[tuple[bytes, str]]]:
    extra = {
        "secondary_tiers": [
            {
                "type": "tenure-fs",
                "root_dir": str(root),
                "n_read_threads": 1,
                "n_write_threads": 1,
                "ssd_capacity_bytes": 3.84e12,
                "ssd_dwpd": 1,
                "ssd_warranty_years": 5,
            }
        ]
    }
    llm = engines.get("lru", spec="TenureCPUTieringSpec", extra=extra)
    manager = live_manager(llm)
    tier = manager.secondary_tiers[0]
    offered: list[tuple[bytes, str]] = []
    if not hasattr(tier, "_spy"):
        store = tier.submit_store

        def spy(job: Any) -> None:
            # Observe what the engine offers and how the tier classifies it, then go on.
            for key in list(job.keys):
                lo, hi = tier._tokens(key, job.req_context)
                offered.append((key, tier.book.classify(job.req_context.req_id, lo, hi)[0]))
            store(job)

        tier.submit_store = spy
        tier._spy = offered
    return llm, tier, tier._spy


def drain(llm: Any) -> None:
    """Finish the engine's steps, then let the tier's writes land and be accounted."""
    from vllm.v1.kv_offload.base import ScheduleEndContext

    settle(llm)
    manager = live_manager(llm)
    for tier in manager.secondary_tiers:
        tier.drain_jobs()
    manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))


def generate(llm: Any, ids: list[int], tags: dict[str, Any]) -> list[int]:
    from vllm import SamplingParams

    params = SamplingParams(
        temperature=0, max_tokens=4, extra_args={"kv_transfer_params": {"tenure": tags}}
    )
    out = llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
    drain(llm)
    return list(out[0].outputs[0].token_ids)


def on_disk(root: Path) -> tuple[int, set[str]]:
    files = list(root.rglob("*.bin"))
    return sum(f.stat().st_size for f in files), {str(f) for f in files}


def counted(tier: Any) -> int:
    """Bytes the tier says it has on disk: written minus deleted, as it measured them."""
    rep = tier.placement_report()
    written = sum(v for k, v in rep["write_bytes"].items() if k.startswith("ssd:"))
    assert rep["ssd_used_bytes"] == written - sum(rep["deleted_bytes"].values())
    used: int = rep["ssd_used_bytes"]
    return used


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, 1900) for _ in range(n)]


def test_reasoning_never_hits_the_ssd_and_a_worker_is_deleted_at_its_return(
    engines: Any, fs_root: Path
) -> None:
    llm, tier, offered = tiered(engines, fs_root)
    path = tier.file_mapper.get_file_name
    rng = random.Random(7)
    p0, r1, o1, u2 = tokens(rng, 2 * BLOCK), tokens(rng, BLOCK), tokens(rng, 100), tokens(rng, 60)
    lead = {"session_id": "L", "segments": [{"id": "ctx", "class": "lead", "start": 0}]}

    generate(llm, p0, {**lead, "turn": 0})
    assert on_disk(fs_root)[0] == counted(tier) == 2 * tier.block_size_bytes

    # Turn 1: the tool loop sends the reasoning back inside the prompt (tokens 256-383).
    with_reasoning = {
        "session_id": "L",
        "turn": 1,
        "segments": [
            {"id": "ctx", "class": "lead", "start": 0},
            {"id": "t0.reasoning", "class": "reasoning", "start": len(p0)},
            {"id": "t0.out", "class": "output", "start": len(p0) + len(r1)},
        ],
    }
    generate(llm, p0 + r1 + o1, with_reasoning)
    reasoning = [k for k, label in offered if label == "reasoning"]
    assert reasoning, "the engine never offered the reasoning block to the SSD tier"
    assert not any(os.path.exists(path(k)) for k in reasoning)
    assert on_disk(fs_root)[0] == counted(tier)

    # Turn 2: the next message strips the reasoning (not declared any more): its segment closes.
    stripped = {
        "session_id": "L",
        "turn": 2,
        "segments": [
            {"id": "ctx", "class": "lead", "start": 0},
            {"id": "t0.out", "class": "output", "start": len(p0)},
        ],
    }
    prompt2 = p0 + o1 + u2
    reference = generate(llm, prompt2, stripped)
    assert tier.book.table.get("L", "t0.reasoning") is None
    lead_files = on_disk(fs_root)[1]
    assert len(lead_files) == 3

    # Two workers with the same expected size (2 blocks): of the 6-block DRAM tier, 3 stay free
    # to stage the lead's 3-block context, so the predictive path keeps only the shorter one in
    # the fast tier (no files) and lets the longer one reach the SSD tier.
    short_w, long_w = tokens(rng, 3 * BLOCK), tokens(rng, 3 * BLOCK)

    def worker(name: str, life: float, turn: int, **more: Any) -> dict[str, Any]:
        return {
            "session_id": f"L/{name}",
            "turn": turn,
            "role": "worker",
            "parent_session": "L",
            "predicted_lifetime_s": life,
            "expected_tokens": 2 * BLOCK,
            "segments": [{"id": "ctx", "class": "worker", "start": 0}],
            **more,
        }

    before = len(offered)
    generate(llm, short_w, worker("short", 10.0, 0))
    short_keys = [k for k, label in offered[before:] if label == "worker"]
    assert len(short_keys) == 3 and not any(os.path.exists(path(k)) for k in short_keys)
    before = len(offered)
    generate(llm, long_w, worker("long", 500.0, 0))
    long_keys = [k for k, label in offered[before:] if label == "worker"]
    assert len(long_keys) == 3 and all(os.path.exists(path(k)) for k in long_keys)
    assert on_disk(fs_root)[0] == counted(tier) == 6 * tier.block_size_bytes

    # The long worker returns: its files go; the lead's stay.
    generate(llm, long_w + tokens(rng, 20), worker("long", 500.0, 1, last_turn=True))
    assert not any(os.path.exists(path(k)) for k in long_keys)
    assert on_disk(fs_root)[1] == lead_files
    assert on_disk(fs_root)[0] == counted(tier)
    generate(llm, short_w + tokens(rng, 20), worker("short", 10.0, 1, last_turn=True))

    # The workers pushed the lead out of DRAM and the engine's pool: its retried turn loads
    # from the files, and the KV read back reproduces the greedy tokens.
    read_before = metric(llm, "vllm:kv_offload_tiering_read_bytes")
    assert generate(llm, prompt2, stripped) == reference
    assert metric(llm, "vllm:kv_offload_tiering_read_bytes") > read_before

    # The lead's last turn ends the session: every file it owned is deleted, nothing leaks.
    generate(llm, prompt2 + tokens(rng, 10), {**stripped, "turn": 3, "last_turn": True})
    assert on_disk(fs_root) == (0, set()) and counted(tier) == 0
    assert tier.book.table.resident_blocks() == 0 and tier.book.table.leaked() == []
    report = tier.placement_report()
    assert report["kept_off_ssd_bytes"]["reasoning"] == tier.block_size_bytes
    assert report["kept_off_ssd_bytes"]["worker"] == 3 * tier.block_size_bytes
    assert report["write_bytes"]["dram:reasoning"] == tier.block_size_bytes
    assert report["projected_device_years"] is not None and report["warranty_years"] == 5.0
    assert metric(llm, "vllm:kv_offload_segment_write_bytes") > 0
    # What the tier would push to the sidecar (tenure.engine_adapter.placement_push) is the same
    # accounting: per tier and class, every file written was deleted by a boundary.
    push = placement_delta(tier.placement_totals(), None, adapter_id="e", seq=1, at=0.0)
    assert push.placement == "lachesis-wt"
    assert push.write_bytes["dram"]["reasoning"] == tier.block_size_bytes
    assert "reasoning" not in push.write_bytes["ssd"]
    assert push.kept_off_ssd_bytes["worker"] == 3 * tier.block_size_bytes
    assert push.deleted_bytes["worker"] == 3 * tier.block_size_bytes  # the long worker's
    assert sum(push.write_bytes["ssd"].values()) == sum(push.deleted_bytes.values()) > 0
    assert push.deleted_files == tier.deleted_files >= 6  # the lead's 3 and the worker's 3
    assert push.ssd_used_bytes == push.ssd_files == 0 and push.ssd_warranty_years == 5.0


def test_bad_segment_input_is_counted_and_served(engines: Any, fs_root: Path) -> None:
    """Unknown parent, double return, malformed segments, a turn going backwards: counted,
    served as untagged, never raised inside the engine."""
    llm, tier, _offered = tiered(engines, fs_root)
    rng = random.Random(11)
    errors = tier.book.errors
    start = dict(errors)

    def bumped(kind: str) -> int:
        return int(errors[kind] - start.get(kind, 0))

    orphan = {"session_id": "X/w", "role": "worker", "parent_session": "nobody", "turn": 0}
    assert len(generate(llm, tokens(rng, 200), orphan)) == 4
    assert bumped("boundary") == 1

    generate(llm, tokens(rng, 200), {"session_id": "B", "turn": 0})
    w = {"session_id": "B/w", "role": "worker", "parent_session": "B", "turn": 0}
    generate(llm, tokens(rng, 200), {**w, "last_turn": True})
    generate(llm, tokens(rng, 200), {**w, "turn": 1, "last_turn": True})
    assert bumped("boundary") == 3  # the second return, and the request of a returned worker

    generate(llm, tokens(rng, 200), {"session_id": "B", "turn": 1, "segments": "all"})
    assert bumped("segments") == 1
    generate(llm, tokens(rng, 200), {"session_id": "B", "turn": 0})
    assert bumped("boundary") == 4
    generate(llm, tokens(rng, 200), {"session_id": "B", "turn": 2, "last_turn": True})
    assert tier.book.table.live_sessions() == []
    assert sum(errors.values()) - sum(start.values()) == 5
    # vLLM exports the counts with its per-step stats (those of a step without outputs can
    # arrive late), so the exported counter trails the tier's own by at most the last few.
    assert 0 < metric(llm, "vllm:kv_offload_segment_errors") <= sum(errors.values())


def test_the_tier_reports_on_its_engines_one_push_connection(engines: Any, tmp_path: Path) -> None:
    """The tier's placement reports go out on the engine's one push connection (one peer, one
    TCP connection from the engine's process), not on a socket of the tier's own."""
    import psutil

    from tenure.engine_adapter.push_client import PushClient
    from tenure.service.wire.push import Hello, PlacementReport
    from tests.engine.router_peer import RouterPeer

    peer = RouterPeer()
    try:
        tier_config = {
            "type": "tenure-fs", "root_dir": str(tmp_path), "n_read_threads": 1,
            "n_write_threads": 1, "push_addr": peer.addr, "push_interval_s": 0.1,
            "engine_id": "fs-e1",
        }  # fmt: skip
        llm = engines.get(
            "lru", spec="TenureCPUTieringSpec", extra={"secondary_tiers": [tier_config]}
        )
        tier = live_manager(llm).secondary_tiers[0]
        assert isinstance(tier.pusher, PushClient) and tier.pusher.policy is None
        generate(llm, tokens(random.Random(7), 3 * BLOCK + 5), {})
        dram = tier.block_size_bytes
        assert peer.wait_for(
            lambda: (
                sum(
                    sum(r.write_bytes.get("dram", {}).values())
                    for r in peer.messages(PlacementReport)
                )
                >= 3 * dram
            ),
            timeout=30,
        )
        assert peer.messages(Hello) and {h.adapter_id for h in peer.messages(Hello)} == {"fs-e1"}
        assert {r.adapter_id for r in peer.messages(PlacementReport)} == {"fs-e1"}
        assert len(peer.identities()) == 1  # Hello and reports: one connection
        mine = psutil.Process(os.getpid()).net_connections(kind="tcp")
        assert sum(1 for c in mine if c.raddr and c.raddr.port == peer.port) == 1
    finally:
        engines.close()
        peer.close()
