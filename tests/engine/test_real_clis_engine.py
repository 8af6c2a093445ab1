"""The real Claude Code and Codex CLIs through ``tenure serve`` into the CPU vLLM with the adapter.

Issue 24's end of a run, on a real engine rather than in the core and the replay: the CLIs from
the npm registry (``tests/harness/clis.py``; skipped, with the reason, only where npm or the
registry cannot be reached) talk to the sidecar exactly as the docs say, and the sidecar's
upstream is vLLM's own server, which serves both routes the CLIs use: ``/v1/messages``
(Anthropic, Claude Code) and ``/v1/responses`` (OpenAI Responses, Codex). Host tier: the
adapter's, small (:data:`HOST_BLOCKS` blocks of 32 tokens), so a flood fills it.

The random-weight model would never stop by itself: a ``--generation-config`` directory makes
every fourth word an end-of-sequence token and sampling greedy (``top_k`` 1; the CLIs send a
temperature but no ``top_k``), so answers are a few words that end with ``end_turn`` and the
same prompt gets the same answer. Both CLIs run with a short system prompt and no tools (Claude
Code: ``--system-prompt``, ``--tools ""``; Codex: ``model_instructions_file``; Codex's tools
stay), so their prompts fit the small pool; every word they send that is not in the model's
vocabulary is one ``<unk>`` token.

What is checked, with the engine's and the CLIs' own numbers:

* a resumed run (``claude -p --continue``, ``codex exec resume --last``) is the same session
  and its prompt is served from the host tier for every full block of the previous request,
  after the engine's own prefix cache was emptied (the one-shot's final answer demoted its
  blocks but did not reclaim them): the CLI's own usage (``cache_read_input_tokens``,
  ``cached_input_tokens``, which vLLM fills from ``prompt_tokens_details``) and vLLM's
  ``external_kv_transfer`` prompt tokens say so;
* a one-shot run's blocks are evicted before a live session's: a not-yet-ended Claude Code run
  (its tenant has ``infer_run_end`` off, so its final answer is a human gap as for an
  interactive session) is stored first, the one-shot run after it, then a flood needs more
  room than is free: every block the adapter evicts is of class ``finished`` (none of a live
  class), and the live run's ``--continue`` still loads all of its prefix from the host tier,
  while the one-shot's ``--continue`` no longer can.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from tenure.service.live.stack import ABStack, ABStackConfig, kv_bytes_per_block
from tenure.service.processes import http_json
from tenure.service.tools.tiny_model import VOCAB_SIZE, word_prompt
from tests.conftest import RedisProcess, wait_for
from tests.engine.conftest import model_cache_dir
from tests.harness import clis

pytestmark = [pytest.mark.engine, pytest.mark.filterwarnings("ignore::FutureWarning")]

BLOCK = 32
#: The engine's own pool: 23 usable blocks, so the longest prompt is 736 tokens.
GPU_BLOCKS = 24
HOST_BLOCKS = 28
BLOCK_BYTES = kv_bytes_per_block(BLOCK)
ADMIN_TOKEN = "engine-clis-admin-token"
ONE_SHOT_KEY = "sk-one-shot-tenant"
LIVE_KEY = "sk-live-tenant-key"
CODEX_KEY = "sk-codex-tenant-key"
FLOOD_KEY = "sk-flood-tenant-key"
TENANTS = {
    ONE_SHOT_KEY: {"name": "oneshot"},
    # Not-yet-ended: the same CLI, but its final answer is not taken as the run's end.
    LIVE_KEY: {"name": "live", "infer_run_end": False},
    CODEX_KEY: {"name": "codex"},
    FLOOD_KEY: {"name": "flood"},
}
#: vLLM's samples (summed over their other labels): prompt tokens loaded from the host tier,
#: prompt tokens looked up in the prefix cache, finished requests, bytes offloaded to the host.
EXTERNAL = ("vllm:prompt_tokens_by_source_total{", 'source="external_kv_transfer"')
QUERIES = ("vllm:prefix_cache_queries_total{", "")
REQUESTS = ("vllm:request_success_total{", "")
OFFLOADED = ("vllm:kv_offload_total_bytes_total{", 'transfer_type="GPU_to_CPU"')
LIVE_CLASSES = ("overdue", "far_wakeup", "idle", "recency", "utility", "ttl", "oracle")


@pytest.fixture(scope="module")
def installed() -> clis.Clis:
    found = clis.install()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def stack(
    installed: clis.Clis, redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ABStack]:
    redis_server.flush()
    work = tmp_path_factory.mktemp("clis-engine")
    generation = work / "generation"
    generation.mkdir()
    # Ids 0-3 are special; every fourth word from 4 on ends an answer (with </s>, id 2).
    stops = [2, *range(4, VOCAB_SIZE, 4)]
    (generation / "generation_config.json").write_text(
        json.dumps({"eos_token_id": stops, "top_k": 1})
    )
    config = ABStackConfig(
        workdir=work,
        model_cache=model_cache_dir(),
        external_redis_url=redis_server.url,
        block_tokens=BLOCK,
        gpu_blocks=GPU_BLOCKS,
        host_blocks=HOST_BLOCKS,
        max_model_len=(GPU_BLOCKS - 1) * BLOCK,
        max_num_seqs=4,
        in_process_worker=True,
        engine_args=["--generation-config", str(generation)],
        # /reset_prefix_cache, to empty the engine's own cache between the steps.
        engine_env={"VLLM_SERVER_DEV_MODE": "1"},
        sidecar_env={"TENURE_ADMIN_TOKEN": ADMIN_TOKEN, "TENURE_TENANTS": json.dumps(TENANTS)},
    )
    local = ABStack(config)
    local.start()
    try:
        yield local
    finally:
        local.stop()


# --- the CLIs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One CLI run: its session, the cached prompt tokens it reports, and what vLLM counted."""

    session: str
    cached: int
    requests: int
    prompt_tokens: int
    external: int


def _engine(stack: ABStack) -> dict[str, float]:
    return stack.engine_metrics()


def _sum(samples: dict[str, float], sample: tuple[str, str]) -> int:
    name, label = sample
    return int(sum(v for k, v in samples.items() if k.startswith(name) and label in k))


def _measured(stack: ABStack, argv: list[str], env: dict[str, str], cwd: Path) -> tuple[str, Run]:
    before = _engine(stack)
    done = clis.run(argv, env, cwd)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    after = _engine(stack)
    run = Run(
        session="",
        cached=0,
        requests=_sum(after, REQUESTS) - _sum(before, REQUESTS),
        prompt_tokens=_sum(after, QUERIES) - _sum(before, QUERIES),
        external=_sum(after, EXTERNAL) - _sum(before, EXTERNAL),
    )
    return done.stdout, run


def _claude(
    stack: ABStack, installed: clis.Clis, work: Path, key: str, system: str, *args: str
) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    env = {**clis.claude_env(stack.proxy_url, key, work / "home", model="tiny")}
    env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = "64"
    argv = [
        str(installed.claude), "-p", *args, "--output-format", "json",
        "--tools", "", "--system-prompt", system,
    ]  # fmt: skip
    stdout, run = _measured(stack, argv, env, work)
    result = json.loads(stdout)
    assert result["is_error"] is False and result["stop_reason"] == "end_turn", result
    usage = result["usage"]
    return Run(
        str(result["session_id"]), int(usage.get("cache_read_input_tokens") or 0),
        run.requests, run.prompt_tokens, run.external,
    )  # fmt: skip


def _codex(stack: ABStack, installed: clis.Clis, work: Path, *args: str) -> Run:
    work.mkdir(parents=True, exist_ok=True)
    home = clis.codex_home(work / "codex-home", f"{stack.proxy_url}/v1", model="tiny")
    instructions = work / "instructions.md"
    instructions.write_text(word_prompt(41, 60))
    env = clis.codex_env(home, CODEX_KEY, work / "home")
    argv = [
        str(installed.codex), "exec", "--skip-git-repo-check", "--json",
        "-c", f"model_instructions_file={json.dumps(str(instructions))}",
        "-c", "include_environment_context=false",
        "-c", "include_permissions_instructions=false",
        *args,
    ]  # fmt: skip
    stdout, run = _measured(stack, argv, env, work)
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    (thread,) = [e["thread_id"] for e in events if e["type"] == "thread.started"]
    (usage,) = [e["usage"] for e in events if e["type"] == "turn.completed"]
    return Run(
        str(thread), int(usage.get("cached_input_tokens") or 0),
        run.requests, run.prompt_tokens, run.external,
    )  # fmt: skip


# --- the sidecar, the adapter and the engine ------------------------------------------------


@dataclass(frozen=True)
class Host:
    """The host tier as the adapter reported it (blocks), and its eviction counters."""

    resident: int
    evicted: dict[str, int]
    refusals: int
    hit_blocks: int

    def evicted_since(self, before: Host) -> dict[str, int]:
        return {
            cls: n - before.evicted.get(cls, 0)
            for cls, n in self.evicted.items()
            if n != before.evicted.get(cls, 0)
        }


def _host(stack: ABStack) -> Host:
    samples = stack.sidecar_metrics()
    resident = sum(v for k, v in samples.items() if k.startswith("tenure_adapter_resident_bytes{"))
    prefix = 'tenure_adapter_evicted_blocks_total{class="'
    evicted = {k[len(prefix) : -2]: int(v) for k, v in samples.items() if k.startswith(prefix)}
    return Host(
        resident=int(resident // BLOCK_BYTES),
        evicted=evicted,
        refusals=int(samples.get("tenure_adapter_refusals_total", 0.0)),
        hit_blocks=int(samples.get("tenure_adapter_host_hit_blocks_total", 0.0)),
    )


def _view(stack: ABStack, key: str, session: str) -> dict[str, Any]:
    def settled() -> dict[str, Any]:
        view = cast(
            "dict[str, Any]",
            http_json(
                "GET", f"{stack.proxy_url}/v1/sessions/{session}",
                headers={"Authorization": f"Bearer {key}"},
            ),
        )  # fmt: skip
        return view if view["state"] != "active" else {}

    return wait_for(settled, timeout_s=30, interval_s=0.1)


def _settle(stack: ABStack) -> Host:
    """Wait until the adapter applied every decision published so far and reported every block
    the engine stored; the host tier as it then stands."""
    db = redis.Redis.from_url(stack.redis_url)
    entries = cast(
        "list[tuple[bytes, dict[bytes, bytes]]]", db.xrevrange("tenure:decisions", count=1)
    )
    newest = json.loads(entries[0][1][b"d"])["seq"] if entries else 0
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def applied() -> bool:
        engines = http_json("GET", f"{stack.proxy_url}/admin/engines", headers=admin)["engines"]
        return bool(engines) and all(e["last_applied_seq"] >= newest for e in engines)

    def reported() -> bool:
        stored = stack.sidecar_metrics().get("tenure_adapter_bytes_stored_total", 0.0)
        return int(stored) == _sum(_engine(stack), OFFLOADED)

    wait_for(applied, timeout_s=30, interval_s=0.1)
    wait_for(reported, timeout_s=30, interval_s=0.1)
    return _host(stack)


def _reset(stack: ABStack, *, host_tier: bool) -> None:
    """Empty the engine's own prefix cache (and the host tier with ``host_tier``); vLLM refuses
    while a transfer is in flight, so ask until it agrees."""
    url = f"{stack.engine_url}/reset_prefix_cache?reset_external={str(host_tier).lower()}"
    wait_for(lambda: http_json("POST", url, {})["success"], timeout_s=30, interval_s=0.2)
    if host_tier:
        wait_for(lambda: _settle(stack).resident == 0, timeout_s=30, interval_s=0.2)


def _flood(stack: ABStack, blocks: int) -> None:
    """One request of another tenant whose prompt is exactly ``blocks`` full blocks (+2 tokens;
    the chat template adds 6 to the words, the answer at most 4)."""
    words = blocks * BLOCK + 2 - 6
    body = {
        "model": "tiny", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": word_prompt(900 + blocks, words)}],
    }  # fmt: skip
    headers = {"Authorization": f"Bearer {FLOOD_KEY}", "X-Tenure-Session": f"flood-{blocks}"}
    http_json("POST", f"{stack.proxy_url}/v1/chat/completions", body, headers)


def _one_shot_ended(view: dict[str, Any]) -> None:
    assert view["reason"] == "likely_end_one_shot", view
    assert view["eviction_class"] == "finished" and view["state"] == "idle", view


# --- the tests ----------------------------------------------------------------------------------


def test_a_resumed_claude_code_run_hits_its_host_blocks(
    stack: ABStack, installed: clis.Clis, tmp_path: Path
) -> None:
    _reset(stack, host_tier=True)
    system = word_prompt(11, 120)
    first = _claude(stack, installed, tmp_path, ONE_SHOT_KEY, system, word_prompt(12, 20))
    assert first.requests == 1, first  # one answer, no tool: the run is one request
    _one_shot_ended(_view(stack, ONE_SHOT_KEY, first.session))
    host = _settle(stack)
    full = first.prompt_tokens // BLOCK  # full blocks of the one request's prompt
    assert host.resident >= full  # demoted, not reclaimed: all still on the host tier
    _reset(stack, host_tier=False)  # the engine's own copies are gone

    again = _claude(
        stack, installed, tmp_path, ONE_SHOT_KEY, system, "--continue", word_prompt(13, 10)
    )
    print(f"\nclaude -p: {first}\nclaude -p --continue: {again} (host blocks {host.resident})")
    assert again.session == first.session  # the same conversation, the same session
    # Every full block of the first run's prompt came back from the host tier.
    assert again.cached >= full * BLOCK, (again, full)
    assert again.external >= full * BLOCK, (again, full)
    assert _settle(stack).hit_blocks - host.hit_blocks >= full
    view = _view(stack, ONE_SHOT_KEY, first.session)
    _one_shot_ended(view)
    assert view["turn"] == first.requests + again.requests  # turns equal answered requests


def test_a_resumed_codex_run_hits_its_host_blocks(
    stack: ABStack, installed: clis.Clis, tmp_path: Path
) -> None:
    _reset(stack, host_tier=True)
    first = _codex(stack, installed, tmp_path, word_prompt(21, 20))
    assert first.requests == 1, first
    _one_shot_ended(_view(stack, CODEX_KEY, first.session))
    host = _settle(stack)
    full = first.prompt_tokens // BLOCK
    assert host.resident >= full
    _reset(stack, host_tier=False)

    again = _codex(stack, installed, tmp_path, "resume", "--last", word_prompt(22, 10))
    print(f"\ncodex exec: {first}\ncodex exec resume --last: {again} (host {host.resident})")
    assert again.session == first.session
    assert again.cached >= full * BLOCK, (again, full)
    assert again.external >= full * BLOCK, (again, full)
    view = _view(stack, CODEX_KEY, first.session)
    _one_shot_ended(view)
    assert view["turn"] == first.requests + again.requests


def test_a_one_shot_run_is_evicted_before_a_live_session(
    stack: ABStack, installed: clis.Clis, tmp_path: Path
) -> None:
    _reset(stack, host_tier=True)
    start = _host(stack)
    live_system, ended_system = word_prompt(31, 200), word_prompt(32, 160)
    live = _claude(stack, installed, tmp_path / "live", LIVE_KEY, live_system, word_prompt(33, 20))
    view = _view(stack, LIVE_KEY, live.session)
    assert view["eviction_class"] != "finished" and not view["reason"].startswith("likely_end")
    live_blocks = _settle(stack).resident
    assert live_blocks >= live.prompt_tokens // BLOCK > 0

    # The one-shot run comes after: under recency alone the live run's blocks would go first.
    ended = _claude(
        stack, installed, tmp_path / "ended", ONE_SHOT_KEY, ended_system, word_prompt(34, 20)
    )
    _one_shot_ended(_view(stack, ONE_SHOT_KEY, ended.session))
    before = _settle(stack)
    # Both runs were stored whole (nothing refused, nothing evicted yet).
    assert before.evicted_since(start) == {} and before.refusals == start.refusals, before
    ended_blocks = before.resident - live_blocks
    assert ended_blocks >= 2, before
    free = HOST_BLOCKS - before.resident
    # A flood that needs all the free room and all but one of the one-shot run's blocks.
    flood = HOST_BLOCKS - live_blocks - 1
    assert free < flood <= GPU_BLOCKS - 2, (free, flood)
    _flood(stack, flood)
    after = _settle(stack)
    assert after.refusals == before.refusals  # the flood was stored
    evicted = after.evicted_since(before)
    print(
        f"\nlive {live}\none-shot {ended}\nhost {HOST_BLOCKS} blocks: live {live_blocks}, "
        f"one-shot {ended_blocks}, free {free}; flood {flood} blocks -> evicted {evicted}"
    )
    assert evicted.get("finished", 0) >= flood - free, (evicted, free, flood)
    assert not {cls: n for cls, n in evicted.items() if cls in LIVE_CLASSES}, evicted

    # The live run resumes: all of its prompt's full blocks are still on the host tier.
    _reset(stack, host_tier=False)
    resumed = _claude(
        stack, installed, tmp_path / "live", LIVE_KEY, live_system, "--continue",
        word_prompt(35, 10),
    )  # fmt: skip
    assert resumed.session == live.session
    full = live.prompt_tokens // BLOCK
    assert resumed.cached >= full * BLOCK and resumed.external >= full * BLOCK, (resumed, full)
    # The one-shot run's blocks were the victims: its resume finds at most one of them.
    _reset(stack, host_tier=False)
    late = _claude(
        stack, installed, tmp_path / "ended", ONE_SHOT_KEY, ended_system, "--continue",
        word_prompt(36, 10),
    )  # fmt: skip
    print(f"live --continue {resumed}\none-shot --continue {late}")
    assert late.session == ended.session
    assert late.external < (ended.prompt_tokens // BLOCK) * BLOCK, (late, ended)
