"""Two CPU vLLM engines behind the real ``vllm-router`` (consistent_hash on X-Session-ID), two
sidecar replicas on one Redis: a session stays on one engine and is served from that engine's
host tier; when the engine dies the router moves the session and the move is counted.

One stack for the module (two vLLM servers start together, ~1 min on this machine).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tenure.service.processes import StackError, http_json, scrape
from tenure.service.stack.multi import MultiStack, MultiStackConfig
from tenure.service.tools.tiny_model import word_prompt
from tests.engine.conftest import model_cache_dir

pytestmark = [pytest.mark.engine, pytest.mark.filterwarnings("ignore::FutureWarning")]

HITS = "vllm:external_prefix_cache_hits_total"
REQUESTS = "vllm:request_success_total"


def _sum(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def _user(seed: int, words: int = 300) -> dict[str, str]:
    return {"role": "user", "content": word_prompt(seed, words)}


@pytest.fixture(scope="module")
def stack(redis_server, tmp_path_factory):
    redis_server.flush()
    config = MultiStackConfig(
        workdir=tmp_path_factory.mktemp("multi"),
        model_cache=model_cache_dir(),
        external_redis_url=redis_server.url,
        sentinel=False,
    )
    with MultiStack(config) as multi:
        yield multi


def _chat(stack: MultiStack, replica: int, messages, session: str | None, timeout: float = 60):
    headers = {"X-Tenure-Session": session, "X-Tenure-Expected-Gap-Ms": "5000"} if session else {}
    body = {"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}
    return http_json(
        "POST", f"{stack.sidecar_url(replica)}/v1/chat/completions", body, headers, timeout=timeout
    )


def _served(stack: MultiStack, alive: list[int]) -> dict[int, float]:
    return {i: _sum(scrape(f"{stack.engine_url(i)}/metrics"), REQUESTS) for i in alive}


def _sidecar_sum(stack: MultiStack, name: str) -> float:
    return sum(_sum(scrape(f"{stack.sidecar_url(i)}/metrics"), name) for i in range(2))


def test_session_sticks_to_its_engine_then_moves_when_it_dies(stack: MultiStack):
    history = [_user(1)]
    before = _served(stack, [0, 1])
    first = _chat(stack, 0, history, "sticky")
    after = _served(stack, [0, 1])
    home = next(i for i in (0, 1) if after[i] > before[i])
    other = 1 - home
    # Every turn, through either replica, lands on the same engine.
    history += [first["choices"][0]["message"], _user(2, 20)]
    for turn, replica in enumerate((1, 0), start=2):
        served = _served(stack, [0, 1])
        reply = _chat(stack, replica, history, "sticky")
        now = _served(stack, [0, 1])
        assert now[home] > served[home] and now[other] == served[other], f"turn {turn} moved"
        history += [reply["choices"][0]["message"], _user(10 + turn, 10)]

    # Other clients flood the home engine's own KV pool; the next turn's prefix comes back
    # from the host tier the adapter governs on that engine.
    for seed in (21, 22, 23):
        body = {"model": "tiny", "messages": [_user(seed)], "max_tokens": 4, "temperature": 0}
        http_json("POST", f"{stack.engine_url(home)}/v1/chat/completions", body, timeout=60)
    hits_before = _sum(scrape(f"{stack.engine_url(home)}/metrics"), HITS)
    reply = _chat(stack, 1, history, "sticky")
    assert _sum(scrape(f"{stack.engine_url(home)}/metrics"), HITS) - hits_before >= 128
    history += [reply["choices"][0]["message"], _user(40, 10)]

    # Per-engine residency, reported under each engine's configured id, on any replica.
    home_id = stack.engine_id(home)
    deadline = time.monotonic() + 20
    rows: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        rows = {
            e["engine"]: e
            for e in http_json("GET", f"{stack.sidecar_url(0)}/admin/engines")["engines"]
        }
        if rows.get(home_id, {}).get("resident_bytes", {}).get("cpu", 0) > 0:
            break
        time.sleep(0.5)
    assert rows[home_id]["resident_bytes"]["cpu"] > 0
    assert set(rows) <= {stack.engine_id(0), stack.engine_id(1)}

    # The home engine dies: the router moves the session to the other engine. A client's
    # retry gets through within the router's health-check interval, nothing waits longer.
    moves_before = _sidecar_sum(stack, "tenure_session_moves_total")
    stack.kill_engine(home)
    killed = time.monotonic()
    served = _served(stack, [other])
    reply = None
    while reply is None and time.monotonic() - killed < 30:
        try:
            reply = _chat(stack, 0, history, "sticky", timeout=20)
        except (OSError, ValueError):
            time.sleep(0.5)
    assert reply is not None and reply["choices"][0]["message"]["content"] is not None
    assert time.monotonic() - killed < 30
    assert _served(stack, [other])[other] > served[other]
    # The new engine's adapter saw a session with earlier turns it never held: one move.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if _sidecar_sum(stack, "tenure_session_moves_total") >= moves_before + 1:
            break
        time.sleep(0.5)
    else:
        raise StackError("the move was never counted")
    moved = {
        e["engine"]: e["sessions_moved_in"]
        for e in http_json("GET", f"{stack.sidecar_url(1)}/admin/engines")["engines"]
    }
    assert moved.get(stack.engine_id(other), 0) >= 1
