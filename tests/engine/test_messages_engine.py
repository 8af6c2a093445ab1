"""A tool-use loop over ``/v1/messages`` (Anthropic Messages) against the real CPU vLLM engine.

Mirrors the chat path's end-to-end test (``test_end_to_end.py``): real Redis, ``tenure serve``
and vLLM's own OpenAI server (which serves the Anthropic route) with the Tenure adapter. The
loop's first turn reaches the adapter under its session id, other clients flood the engine's
pool, and the loop's return (a ``tool_result``) is served from the host tier the adapter
governs; ending the session reclaims exactly its blocks, found by that id.
"""

from __future__ import annotations

from typing import Any

import pytest

from tenure.service.processes import http_json
from tenure.service.stack import LocalStack, StackConfig
from tenure.service.tools.tiny_model import word_prompt
from tests.engine.conftest import model_cache_dir

pytestmark = [pytest.mark.engine, pytest.mark.filterwarnings("ignore::FutureWarning")]

RECLAIMED = 'tenure_adapter_evicted_blocks_total{class="reclaim"}'
HITS = "vllm:external_prefix_cache_hits_total"


def _sum(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    redis_server.flush()
    config = StackConfig(
        workdir=tmp_path_factory.mktemp("stack-messages"),
        model_cache=model_cache_dir(),
        external_redis_url=redis_server.url,
    )
    local = LocalStack(config)
    local.start()
    yield local
    local.stop()


def _messages(stack: LocalStack, messages: list[Any], session: str | None) -> dict[str, Any]:
    headers = {"X-Tenure-Session": session} if session else {}
    body = {"model": "tiny", "max_tokens": 8, "temperature": 0, "messages": messages}
    reply: dict[str, Any] = http_json("POST", f"{stack.proxy_url}/v1/messages", body, headers)
    return reply


def test_tool_loop_over_messages_returns_from_the_host_tier(stack: LocalStack):
    history: list[Any] = [{"role": "user", "content": word_prompt(1, 300)}]
    first = _messages(stack, history, "cc-engine")
    assert first["type"] == "message" and first["stop_reason"] in {"end_turn", "max_tokens"}
    # The harness ran a tool: the assistant's tool_use and its result extend the prefix.
    history += [
        {"role": "assistant", "content": [
            *first["content"],
            {"type": "tool_use", "id": "toolu_1", "name": "run_tests", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": word_prompt(2, 20)}]},
    ]  # fmt: skip
    stored = stack.wait_metric("tenure_adapter_stored_blocks_total", lambda v: v >= 2)
    assert stored >= 2
    for seed in (11, 12, 13):  # other clients flood the engine's own pool
        _messages(stack, [{"role": "user", "content": word_prompt(seed, 300)}], None)
    before = stack.engine_metrics()
    second = _messages(stack, history, "cc-engine")
    assert second["type"] == "message"
    after = stack.engine_metrics()
    # The loop's prefix came back from the host tier the adapter governs.
    assert _sum(after, HITS) - _sum(before, HITS) >= 128
    stack.wait_metric("tenure_adapter_host_hit_blocks_total", lambda v: v >= 1)

    record = http_json("GET", f"{stack.proxy_url}/v1/sessions/cc-engine")
    assert record["turn"] == 2 and record["stop_reason"] == second["stop_reason"]
    assert record["expected_gap_s"] is not None

    # The adapter knows the session by the id the proxy put in kv_transfer_params.tenure:
    # ending it frees exactly its host blocks.
    reclaimed_before = stack.sidecar_metrics().get(RECLAIMED, 0.0)
    http_json("POST", f"{stack.proxy_url}/v1/sessions/cc-engine/end", {})
    reclaimed = stack.wait_metric(RECLAIMED, lambda v: v > reclaimed_before, timeout=20)
    assert reclaimed - reclaimed_before >= 2
