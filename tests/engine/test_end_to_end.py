"""End to end: real Redis + ``tenure serve`` + a real vLLM OpenAI server with the adapter plugin.

One stack per module (the vLLM server takes ~30 s to start here). The tests run in order:
a multi-turn session through the proxy, then a sidecar restart, then an engine restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tenure.service.processes import ManagedProcess, free_port, http_json, http_ok
from tenure.service.stack import TENURE_ARGV, LocalStack, StackConfig
from tenure.service.tools.tiny_model import word_prompt
from tests.engine.conftest import model_cache_dir

pytestmark = [pytest.mark.engine, pytest.mark.filterwarnings("ignore::FutureWarning")]

RECLAIMED = 'tenure_adapter_evicted_blocks_total{class="reclaim"}'


def _sum(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    redis_server.flush()  # earlier modules' sessions and decisions are not this stack's
    config = StackConfig(
        workdir=tmp_path_factory.mktemp("stack"),
        model_cache=model_cache_dir(),
        external_redis_url=redis_server.url,
    )
    local = LocalStack(config)
    local.start()
    yield local
    local.stop()


def user(seed: int, words: int = 300) -> dict[str, str]:
    return {"role": "user", "content": word_prompt(seed, words)}


def test_multi_turn_session_reaches_policy_and_decisions_apply(stack: LocalStack):
    history = [user(1)]
    first = stack.chat(history, session="e2e-1", expected_gap_ms=3000)
    history += [first["choices"][0]["message"], user(2, 20)]
    for seed in (11, 12, 13):  # other clients flood the engine's own pool
        stack.chat([user(seed)])
    engine_before = stack.engine_metrics()
    stack.chat(history, session="e2e-1", expected_gap_ms=3000)
    engine_after = stack.engine_metrics()
    # Turn 2's prefix came back from the host tier the adapter governs.
    hits = "vllm:external_prefix_cache_hits_total"
    assert _sum(engine_after, hits) - _sum(engine_before, hits) >= 128
    stack.wait_metric("tenure_adapter_host_hit_blocks_total", lambda v: v >= 1)
    stored = stack.wait_metric("tenure_adapter_stored_blocks_total", lambda v: v >= 2)
    assert stored >= 2

    # Ending the session is a pushed decision: the adapter (woken, no traffic needed) frees
    # exactly that session's host blocks, which it knows by the id the proxy put in
    # kv_transfer_params.tenure.
    reclaimed_before = stack.sidecar_metrics().get(RECLAIMED, 0.0)
    http_json("POST", f"{stack.proxy_url}/v1/sessions/e2e-1/end", {})
    reclaimed = stack.wait_metric(RECLAIMED, lambda v: v > reclaimed_before, timeout=20)
    assert reclaimed - reclaimed_before >= 2
    decisions = http_json("GET", f"{stack.proxy_url}/admin/decisions?limit=50")["decisions"]
    assert any(d["session_id"].endswith("e2e-1") and d["state"] == "finished" for d in decisions)
    # Every decision sent has been applied (the adapter reports its last applied seq).
    adapter = stack.adapters()[0]
    stack.wait_metric(f'tenure_push_seq_behind{{adapter="{adapter}"}}', lambda v: v == 0)


def test_sidecar_restart_adapter_resyncs_from_snapshot(stack: LocalStack):
    adapter = stack.adapters()[0]
    stack.chat([user(31)], session="e2e-resync", expected_gap_ms=60000)
    stack.wait_metric("tenure_adapter_stored_blocks_total", lambda v: v >= 1)
    assert stack.sidecar is not None
    stack.sidecar.stop(kill=True)

    # While the adapter's sidecar is down, another replica (same Redis, no push channel)
    # ends the session: the decision exists only in Redis.
    replica_port = str(free_port())
    replica = ManagedProcess(
        "replica",
        [*TENURE_ARGV, "serve", "--dev", "--port", replica_port],
        Path(stack.logs) / "replica.log",
        env={
            "TENURE_REDIS_URL": stack.redis_url,
            "TENURE_UPSTREAM_URL": stack.engine_url,
            "TENURE_PUSH_ADDR": "",
            "TENURE_DEV_MODE": "true",
        },
    )
    replica.start()
    try:
        replica.wait_until(lambda: http_ok(f"http://127.0.0.1:{replica_port}/healthz"), 60)
        http_json("POST", f"http://127.0.0.1:{replica_port}/v1/sessions/e2e-resync/end", {})
    finally:
        replica.stop()

    stack.start_sidecar()  # same ports: the adapter's DEALER reconnects on its own
    assert stack.wait_for_adapter() == adapter  # the same engine, re-announced by Hello
    # The snapshot it got carried the decision it missed: the session's blocks are reclaimed.
    stack.wait_metric(RECLAIMED, lambda v: v >= 1, timeout=20)
    metrics = stack.sidecar_metrics()
    assert metrics.get('tenure_push_messages_total{direction="in",kind="hello"}', 0) >= 1
    assert metrics.get('tenure_push_messages_total{direction="out",kind="snapshot"}', 0) >= 1


def test_engine_restart_adapter_starts_clean_and_resyncs(stack: LocalStack):
    old = set(stack.adapters())
    new = stack.restart_engine(kill=True)
    assert new not in old
    # A fresh adapter: nothing resident, and it serves and stores again through the proxy.
    stored_before = stack.sidecar_metrics().get("tenure_adapter_stored_blocks_total", 0.0)
    reply = stack.chat([user(41)], session="e2e-after-restart", expected_gap_ms=3000)
    assert reply["choices"][0]["message"]["content"]
    stack.wait_metric("tenure_adapter_stored_blocks_total", lambda v: v > stored_before)
    stack.wait_metric(f'tenure_push_seq_behind{{adapter="{new}"}}', lambda v: v == 0)
    # The new adapter announced itself from scratch (Hello with last_seq -1) and got a snapshot.
    metrics = stack.sidecar_metrics()
    assert metrics.get('tenure_push_messages_total{direction="in",kind="hello"}', 0) >= 2
