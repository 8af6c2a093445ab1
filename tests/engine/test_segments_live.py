"""Live: lifetime-aware placement driven by the sidecar, through the proxy, onto a real SSD tier.

A real vLLM OpenAI server (CPU) with ``TenureCPUTieringSpec`` and a ``tenure-fs`` secondary tier
in a temporary directory, with vLLM's ``deepseek_r1`` reasoning parser; the tiny random-weight
model's tokenizer gets ``<think>`` / ``</think>`` tokens (two of its words renamed), so the
parser reports the whole random output as reasoning, as it does for an R1-style model that
never closes its thinking. The sidecar runs in front (``TENURE_SEGMENTS=true``, real Redis)
and every request goes through it; the harness only marks its sessions, the reasoning hint of
the first turn and the worker's spawn and return. The sidecar infers the rest (the response's
reasoning and whether the next request carries it back, token boundaries from the engine's
``usage`` and ``/tokenize``) and the engine's tier enforces it.

Checked from outside the engine, as an operator would: the files under the tier's directory
and the tier's own metrics (``vllm:kv_offload_segment_*``, ``vllm:kv_offload_ssd_*``).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from tenure.engine_adapter.cpu_engine import (
    CPU_ENGINE_ENV,
    bytes_per_block,
    kv_transfer_config,
    server_args,
)
from tenure.service.app import create_app
from tenure.service.processes import ManagedProcess, free_port, http_ok
from tenure.service.settings import Settings
from tenure.service.tools.tiny_model import word_prompt
from tests.sidecar.fake_upstream import ServerThread

# The vLLM server's start is part of the first test's time (~60 s alone, 3 min on a busy VM).
pytestmark = [
    pytest.mark.engine,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.timeout(900),
]

BLOCK = 128
BLOCK_BYTES = bytes_per_block()


def reasoning_model(source: Path, target: Path) -> Path:
    """A copy of the tiny model whose tokenizer knows the think markers (two words renamed)."""
    shutil.copytree(source, target)
    path = target / "tokenizer.json"
    doc = json.loads(path.read_text())
    vocab = doc["model"]["vocab"]
    vocab["<think>"] = vocab.pop("w2039")
    vocab["</think>"] = vocab.pop("w2040")
    path.write_text(json.dumps(doc))
    return target


@pytest.fixture(scope="module")
def live(
    tiny_model: str, redis_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("segments-live")
    model = reasoning_model(Path(tiny_model), work / "model")
    root = work / "ssd"
    root.mkdir()
    tier = {
        "type": "tenure-fs",
        "root_dir": str(root),
        "n_read_threads": 1,
        "n_write_threads": 1,
        "ssd_capacity_bytes": 3.84e12,
        "ssd_dwpd": 1,
        "ssd_warranty_years": 5,
    }
    # Generated blocks are offloaded too (vLLM's default offloads prompt blocks only), so the
    # reasoning a response generates meets the tier as well as the reasoning sent back.
    extra = {"secondary_tiers": [tier], "offload_prompt_only": False}
    transfer = kv_transfer_config(
        policy="lru", host_blocks=6, spec="TenureCPUTieringSpec", extra=extra
    )
    port = free_port()
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    argv += server_args(str(model), port, gpu_blocks=6, transfer=transfer, max_model_len=640)
    argv += ["--reasoning-parser", "deepseek_r1"]
    engine = ManagedProcess(
        "vllm",
        argv,
        work / "vllm.log",
        env={**CPU_ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    engine_url = f"http://127.0.0.1:{port}"
    redis_server.flush()
    sidecar: ServerThread | None = None
    try:
        engine.start().wait_until(lambda: http_ok(f"{engine_url}/health"), 300)
        settings = Settings(
            redis_url=SecretStr(redis_server.url),
            upstream_url=engine_url,
            segments=True,
            segment_tokenize=True,
            dev_mode=True,
            push_addr="",
            upstream_read_timeout_s=120.0,
        )
        sidecar = ServerThread(create_app(settings)).start()
        yield {"engine": engine_url, "proxy": sidecar.url, "root": root, "log": work / "vllm.log"}
    finally:
        if sidecar is not None:
            sidecar.stop()
        engine.stop()


def samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def value(rows: list[tuple[str, dict[str, str], float]], name: str, **labels: str) -> float:
    return sum(
        v
        for n, lab, v in rows
        if n == name and all(lab.get(k) == want for k, want in labels.items())
    )


def on_disk(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*.bin"))


def settle(
    live: dict[str, Any], ready: Callable[[list[Any]], bool], timeout: float = 60
) -> list[Any]:
    """Untagged one-token steps (they store nothing) until the tier's stats, exported with
    each step's output, satisfy ``ready`` and match the directory."""
    deadline = time.monotonic() + timeout
    rows: list[Any] = []
    while time.monotonic() < deadline:
        httpx.post(
            f"{live['engine']}/v1/completions",
            json={"model": "tiny", "prompt": [5], "max_tokens": 1},
            timeout=60,
        )
        rows = samples(live["engine"])
        used = value(rows, "vllm:kv_offload_ssd_used_bytes")
        if ready(rows) and used == on_disk(live["root"]):
            return rows
        time.sleep(0.3)
    seen = {f"{n}{lab}": v for n, lab, v in rows if "segment" in n or "ssd_used" in n}
    raise AssertionError(f"the tier never settled: on disk {on_disk(live['root'])}, {seen}")


WRITE = "vllm:kv_offload_segment_write_bytes_total"
KEPT = "vllm:kv_offload_segment_kept_off_ssd_bytes_total"
DELETED = "vllm:kv_offload_segment_deleted_bytes_total"


def chat(
    live: dict[str, Any], session: str, messages: list[Any], max_tokens: int, **headers: str
) -> dict[str, Any]:
    response = httpx.post(
        f"{live['proxy']}/v1/chat/completions",
        json={"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0},
        headers={"X-Tenure-Session": session, **headers},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_reasoning_stays_off_the_ssd_and_a_worker_is_deleted_at_its_return(live: dict[str, Any]):
    root = live["root"]
    history: list[Any] = [{"role": "user", "content": word_prompt(1, 250)}]

    # Turn 1: the harness says the model reasons; the sidecar counts the prompt (/tokenize)
    # and declares the generation a reasoning segment before it is generated.
    first = chat(live, "L", history, 140, **{"X-Tenure-Reasoning": "true"})
    message = first["choices"][0]["message"]
    assert message.get("reasoning"), message  # the engine's parser: all of it is reasoning
    p1 = first["usage"]["prompt_tokens"]
    rows = settle(live, lambda r: value(r, WRITE, tier="ssd", segment_class="lead") > 0)
    assert value(rows, WRITE, tier="ssd", segment_class="lead") == (p1 // BLOCK) * BLOCK_BYTES
    # The generated block [256, 384) is all reasoning: stored in DRAM, refused by the SSD tier.
    generated_reasoning = value(rows, KEPT, segment_class="reasoning")
    assert generated_reasoning >= BLOCK_BYTES
    assert value(rows, WRITE, tier="ssd", segment_class="reasoning") == 0

    # Turn 2: a tool loop sends the reasoning back inline; the sidecar sees it carried and keeps
    # its segment (now inside the prompt) off the SSD.
    history += [
        {"role": "assistant", "content": f"<think> {message['reasoning']} </think>"},
        {"role": "user", "content": word_prompt(2, 20)},
    ]
    second = chat(live, "L", history, 40)
    rows = settle(
        live,
        lambda r: value(r, KEPT, segment_class="reasoning") >= generated_reasoning + BLOCK_BYTES,
    )
    assert value(rows, WRITE, tier="ssd", segment_class="reasoning") == 0
    reasoning_kept = value(rows, KEPT, segment_class="reasoning")

    # Turn 3: the harness strips the reasoning (and the sidecar sees it did): the reasoning
    # segments close; none of them ever reached the disk.
    history[-2] = {"role": "assistant", "content": "w7 w8 w9"}
    history += [
        {"role": "assistant", "content": second["choices"][0]["message"].get("content") or "w1"},
        {"role": "user", "content": word_prompt(3, 10)},
    ]
    chat(live, "L", history, 8)
    rows = settle(live, lambda r: True)
    assert value(rows, WRITE, tier="ssd", segment_class="reasoning") == 0
    lead_bytes = on_disk(root)
    assert lead_bytes > 0

    # A worker spawned through the lifecycle API (the ranker's heuristic predicts its life), with
    # an expected context larger than DRAM can keep: its blocks go to the SSD tier.
    spawn = httpx.post(
        f"{live['proxy']}/v1/sessions/L/workers",
        json={"worker_id": "w", "subagent_type": "general-purpose", "expected_tokens": 4000,
              "model": "tiny"},
        timeout=30,
    )  # fmt: skip
    assert spawn.status_code == 201, spawn.text
    assert spawn.json()["predicted_lifetime_s"] == pytest.approx(298.3)
    chat(live, "w", [{"role": "user", "content": word_prompt(9, 400)}], 4)
    rows = settle(live, lambda r: value(r, WRITE, tier="ssd", segment_class="worker") > 0)
    worker_bytes = value(rows, WRITE, tier="ssd", segment_class="worker")
    assert worker_bytes == 3 * BLOCK_BYTES
    assert on_disk(root) == lead_bytes + worker_bytes

    # Its return (lifecycle API): the sidecar tells the engine, which deletes its files only.
    back = httpx.post(f"{live['proxy']}/v1/sessions/w/return", timeout=60)
    assert back.status_code == 200, back.text
    rows = settle(live, lambda r: value(r, DELETED, segment_class="worker") == worker_bytes)
    assert on_disk(root) == lead_bytes
    again = httpx.post(f"{live['proxy']}/v1/sessions/w/return", timeout=30)
    assert again.status_code == 409 and again.json()["error"]["code"] == "worker_returned"

    # The lead's last turn ends everything: nothing left on disk, nothing counted.
    history += [{"role": "assistant", "content": "w2"}, {"role": "user", "content": "w3"}]
    chat(live, "L", history, 2, **{"X-Tenure-Last-Turn": "true"})
    rows = settle(live, lambda r: value(r, "vllm:kv_offload_ssd_used_bytes") == 0)
    assert on_disk(root) == 0
    assert value(rows, WRITE, tier="ssd", segment_class="reasoning") == 0
    assert value(rows, "vllm:kv_offload_segment_errors_total") == 0
    print(
        f"live: lead {lead_bytes} B on disk, worker {worker_bytes} B written and deleted, "
        f"reasoning kept off the SSD {reasoning_kept} B (generated {generated_reasoning} B), "
        f"ssd reasoning writes 0, errors 0"
    )
