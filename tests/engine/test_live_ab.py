"""``tenure up``'s A/B on a small slice, end to end: two fresh stacks (Redis, sidecar, CPU vLLM
with the adapter), the slice through the proxy, the simulator beside it, the recording.

One run (about two engine starts plus two ~15 s arms) carries every check that needs the live
stack: the JSON schema the issue names, every call answered as the trace's answer was (tool
calls by structured output), the simulator within a loose tolerance of the engine and with the
same gap between the arms, nothing left running, and the recorded traffic replaying as the same
sessions, turns and token counts.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tenure.service.processes import http_ok
from tenure.service.stack import TENURE_ARGV

pytestmark = pytest.mark.engine

ARM_KEYS = {
    "host_hit_rate", "prompt_tokens_computed", "prompt_tokens_cached", "resumed_ttft_p50_s",
    "resumed_ttft_p95_s", "jct_p50_s", "jct_p95_s", "refused_stores", "evictions",
}  # fmt: skip
#: The small slice: --quick's (4 root sessions, 12 calls each, gaps / 60 capped at 4 s), on the
#: tests' tiny model, whose profile was measured on a quiet VM: on this slice the demo model's
#: simulated arms are 0.6 pp apart, too close for the sign check below (measured 2026-12-02).
SLICE = ["--quick", "--seed", "0", "--layout", "tiny"]
#: Loose: an 84-call slice on a shared 2-core machine (the full run's targets are 5 pp / 10%).
#: Hit rate barely moves with the engine's speed; prompt tokens computed does (a slower engine
#: overlaps more calls in the small pool, so fewer prefix hits survive): measured +16% / +23%
#: over the simulator with the VM at load 6, +1% / +7% at load 2.
HIT_TOLERANCE_PP = 12.0
COMPUTED_TOLERANCE = 0.35
#: The tenure - lru hit-rate gap, live against simulated (measured 1.6 and 0.7 pp, quiet VM).
ORDER_TOLERANCE_PP = 10.0


def _tenure(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TENURE_ARGV, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def ab(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ab")
    result = _tenure(
        "up", *SLICE, "--port", "0", "--json", str(out / "ab.json"),
        "--record", str(out / "rec.jsonl"), timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads((out / "ab.json").read_text())
    return {"doc": doc, "stdout": result.stdout, "record": out / "rec.jsonl", "dir": out}


@pytest.mark.timeout(700)
def test_json_has_the_issue_schema_and_every_call_answered(ab: dict[str, Any]) -> None:
    doc = ab["doc"]
    assert {"config", "arms", "simulated"} <= set(doc)
    for side in ("arms", "simulated"):
        assert set(doc[side]) == {"lru", "tenure"}
        for arm in doc[side].values():
            assert set(arm) >= ARM_KEYS
    calls = doc["config"]["calls"]
    for arm in doc["arms"].values():
        assert arm["turns"] == calls and arm["failed_turns"] == 0
        # Prompt and answer token counts are the slice's, call for call.
        assert arm["token_count_mismatches"] == 0
        assert arm["tool_call_answers"] > 0  # structured output made the model call the tool
    tools = {name: Counter(c["finish_reason"] for c in doc["calls"][name]) for name in doc["calls"]}
    assert tools["lru"] == tools["tenure"]  # the same answers in both arms
    assert "host-tier hit rate" in ab["stdout"] and "tenure - lru" in ab["stdout"]
    # --quick: both stacks started together; what the waiting one cost the first arm is said.
    assert doc["config"]["quick"] is True and doc["config"]["engine"]["executor"] == "uni"
    share = doc["config"]["waiting_stacks_cpu_share"]
    assert share["tenure"] is None and 0 <= share["lru"] < 0.5
    assert "the stacks still waiting used" in ab["stdout"]
    # The engine's measured speed beside the profile's, per arm.
    for speed in doc["engine_speed"].values():
        assert speed["requests"] >= calls
        assert speed["prefill_tokens_per_s"] > 0 and speed["profile_prefill_tokens_per_s"] > 0
        assert speed["decode_step_s"] > 0 and speed["profile_decode_step_s"] > 0
        assert ("warning:" in ab["stdout"]) >= speed["out_of_regime"]


def test_out_of_regime_flags_a_speed_more_than_twice_off_the_profile() -> None:
    from tenure.service.live.speed import engine_speed, out_of_regime
    from tenure.service.replay.hardware import get_profile

    profile = get_profile("cpu-tiny-fp32")
    metrics = {
        'vllm:prompt_tokens_by_source_total{source="local_compute"}': 10_000.0,
        'vllm:prompt_tokens_by_source_total{source="local_cache_hit"}': 5_000.0,
        "vllm:request_prefill_time_seconds_count": 10.0,
        "vllm:generation_tokens_total": 110.0,
    }
    step = 0.01  # the simulated arm's decode step
    model = engine_speed({**metrics, "vllm:request_prefill_time_seconds_sum": 1.0}, profile, step)
    at_model = model["profile_prefill_tokens_per_s"]
    # The profile's own speeds are in the regime; a third of them (or triple) is not.
    for prefill_s, decode_s, off in (
        (10_000 / at_model, 100 * step, 0),
        (3 * 10_000 / at_model, 100 * step, 1),
        (10_000 / at_model / 3, 3 * 100 * step, 2),
    ):
        speed = engine_speed(
            {
                **metrics,
                "vllm:request_prefill_time_seconds_sum": prefill_s,
                "vllm:request_decode_time_seconds_sum": decode_s,
            },
            profile,
            step,
        )
        assert speed["requests"] == 10
        assert len(out_of_regime(speed)) == off, speed
    assert engine_speed({}, profile, step)["prefill_tokens_per_s"] is None


@pytest.mark.timeout(700)
def test_simulator_tracks_the_engine_and_the_gap_between_the_arms(ab: dict[str, Any]) -> None:
    live, sim = ab["doc"]["arms"], ab["doc"]["simulated"]
    for name in ("lru", "tenure"):
        gap_pp = 100 * abs(live[name]["host_hit_rate"] - sim[name]["host_hit_rate"])
        assert gap_pp <= HIT_TOLERANCE_PP, (name, live[name], sim[name])
        computed = live[name]["prompt_tokens_computed"]
        predicted = sim[name]["prompt_tokens_computed"]
        assert abs(computed - predicted) <= COMPUTED_TOLERANCE * predicted, (name, computed)
    # The gap between the arms, as the simulator predicts it and as the engine shows it: the
    # same sign, and close. (The full run, `make demo`, is the A/B; this checks the harness.)
    sim_order = sim["tenure"]["host_hit_rate"] - sim["lru"]["host_hit_rate"]
    live_order = live["tenure"]["host_hit_rate"] - live["lru"]["host_hit_rate"]
    assert abs(sim_order) > 0.03, "the slice no longer separates the arms in the simulator"
    assert live_order * sim_order > 0, (live_order, sim_order)
    assert abs(live_order - sim_order) <= ORDER_TOLERANCE_PP / 100, (live_order, sim_order)


@pytest.mark.timeout(700)
def test_verdict_block_costs_and_one_interleaving(ab: dict[str, Any]) -> None:
    """Issue 28: both arms follow the simulated run's order, every headline figure is either
    given to an arm or said to be not separated, and the model's recompute/load ratio is
    printed beside the GPU profile's."""
    doc = ab["doc"]
    assert doc["config"]["layout"] == "tiny"
    assert doc["config"]["dispatch"].startswith("planned")
    for arm in doc["arms"].values():
        assert arm["gate_forced"] == 0 and arm["gate_held_s"] >= 0
    for calls in doc["calls"].values():
        assert all(c["cached_tokens"] is not None for c in calls)
    assert "total_computed_tokens" in doc["paired_delta"]
    rows = {r["figure"]: r for r in doc["verdict"]}
    assert set(rows) == {
        "host_hit_rate",
        "prompt_tokens_computed",
        "resumed_ttft",
        "turn_completion",
    }
    for row in rows.values():
        assert (row["better"] in ("lru", "tenure")) != bool(row["why_not_separated"]), row
    assert ab["stdout"].count("verdict: tenure - lru") == 4
    costs = doc["block_costs"]
    assert costs["gpu_profile"]["ratio"] > 5
    assert costs["this_run"]["ratio"] > 0  # the tenure arm loaded from the host tier
    assert "h100-llama3-8b" in ab["stdout"] and "recompute/load" in ab["stdout"]


@pytest.mark.timeout(700)
def test_nothing_left_running(ab: dict[str, Any]) -> None:
    for stack in ab["doc"]["config"]["stacks"].values():
        assert not http_ok(stack["proxy"] + "/healthz")
        assert not http_ok(stack["engine"] + "/health")
        assert not Path(stack["logs"]).exists()  # the work directory is removed


@pytest.mark.timeout(700)
def test_recorded_traffic_replays_as_the_same_sessions_turns_and_tokens(
    ab: dict[str, Any],
) -> None:
    from tenure.service.replay.loaders.canonical import load_canonical

    doc = ab["doc"]
    recorded = load_canonical(ab["record"])
    sent: dict[int, list[tuple[int, int]]] = {}
    for call in doc["calls"]["tenure"]:
        sent.setdefault(call["session"], []).append(
            (call["prompt_tokens"], call["completion_tokens"])
        )
    want = Counter(tuple(v) for v in sent.values())
    got = Counter(
        tuple((t.input_tokens, t.output_tokens) for t in s.turns) for s in recorded.sessions
    )
    assert len(recorded.sessions) == doc["config"]["sessions"] + doc["config"]["sub_agents"]
    assert got == want
    # Appends share their prefix in the recorded structure, as they did in the engine.
    assert sum(t.seen_blocks for s in recorded.sessions for t in s.turns) > 0
    out = ab["dir"] / "replay.json"
    result = _tenure(
        "replay", "ladder", "--format", "canonical", "--trace", str(ab["record"]),
        "--policies", "lru,tenure", "--hardware", "cpu-tiny-fp32", "--host-gib", "0.01",
        "--arrival-rate", "1", "--seeds", "0", "--boot", "0", "--jobs", "1",
        "--json", str(out), timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert doc["config"]["calls"] == sum(len(s.turns) for s in recorded.sessions)
