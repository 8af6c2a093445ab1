"""``tenure replay``: bad input is one line and exit 2; good input writes the documented JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tenure.service.cli import main

RESULT_KEYS = {
    "p50_jct_s",
    "p95_jct_s",
    "mean_jct_s",
    "p95_ttft_s",
    "mean_ttft_s",
    "host_hit_rate",
    "host_bytes_stored",
    "host_bytes_loaded",
    "prefill_tokens",
    "turns",
    "throughput_turns_per_s",
    "p95_jct_ci",
    "counters",
}


def _fails(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert needle in err


def test_bad_input_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], claude_path: Path, tmp_path: Path
) -> None:
    base = ["replay", "ladder", "--trace", str(claude_path), "--max-sessions", "2"]
    _fails(capsys, [*base, "--policies", "lru,nope"], "unknown policy 'nope'")
    _fails(capsys, [*base, "--hardware", "tpu-v9"], "unknown hardware 'tpu-v9'")
    _fails(capsys, [*base, "--arrival-rate", "-1"], "--arrival-rate must be a positive")
    _fails(capsys, [*base, "--arrival-rate", "abc"], "--arrival-rate must be a number")
    _fails(capsys, [*base, "--host-gib", "-4"], "--host-gib must be a non-negative")
    _fails(capsys, [*base, "--seeds", "1,x"], "--seeds")
    _fails(capsys, [*base, "--max-sessions", "0"], "--max-sessions")
    _fails(capsys, [*base, "--policies", "lru,tenure", "--paired-vs", "ttl"], "--paired-vs ttl")
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(claude_path.read_bytes()[:20000])
    _fails(capsys, ["replay", "ladder", "--trace", str(truncated)], f"{truncated}:")
    garbage = tmp_path / "x.jsonl"
    garbage.write_text('{"id": 1}\n[1, 2]\n')
    _fails(
        capsys,
        ["replay", "ladder", "--trace", str(garbage), "--format", "claude-code"],
        "x.jsonl:1",
    )
    _fails(capsys, ["replay", "ladder", "--trace", str(tmp_path / "none.gz")], "no such trace")
    _fails(
        capsys,
        ["replay", "sweep", *base[2:], "--param", "host-gib", "--values", "8,-1"],
        "--values",
    )


def test_ladder_writes_the_documented_json(
    capsys: pytest.CaptureFixture[str], claude_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ladder.json"
    plot = tmp_path / "ladder.png"
    argv = [
        "replay",
        "ladder",
        "--trace",
        str(claude_path),
        "--max-sessions",
        "6",
        "--policies",
        "tenure,lru,notier",
        "--arrival-rate",
        "0.01",
        "--host-gib",
        "8",
        "--seeds",
        "0,1",
        "--boot",
        "50",
        "--jobs",
        "2",
        "--json",
        str(out),
        "--plot",
        str(plot),
        "--paired-vs",
        "lru,notier,tenure",
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "tenure" in table and "p95 JCT" in table
    doc = json.loads(out.read_text())
    assert set(doc) == {"config", "results", "paired_delta_p95_vs"}
    assert doc["config"]["p95_live_working_set_gib"] > 0
    assert list(doc["results"]) == ["notier", "lru", "tenure"]  # ladder order
    for result in doc["results"].values():
        assert set(result) >= RESULT_KEYS
        lo, hi = result["p95_jct_ci"]
        assert lo <= result["p95_jct_s"] <= hi
    assert set(doc["paired_delta_p95_vs"]) == {"lru", "notier", "tenure"}
    assert doc["paired_delta_p95_vs"]["lru"]["lru"] == [0.0, 0.0, 0.0]
    assert plot.stat().st_size > 10_000


def test_mooncake_replays_through_the_ladder_and_sweep(
    capsys: pytest.CaptureFixture[str], mooncake_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep.json"
    argv = [
        "replay",
        "sweep",
        "--trace",
        str(mooncake_path),
        "--format",
        "mooncake",
        "--max-sessions",
        "60",
        "--policies",
        "lru,tenure,infinite",
        "--arrival-rate",
        "0.5",
        "--seeds",
        "0",
        "--boot",
        "0",
        "--jobs",
        "1",
        "--param",
        "host-gib",
        "--values",
        "1,4",
        "--json",
        str(out),
        "--plot",
        str(tmp_path / "sweep.png"),
    ]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["param"] == "host-gib" and doc["values"] == [1.0, 4.0]
    small, large = doc["points"]
    assert small["config"]["block_tokens"] == 512
    for point in doc["points"]:
        assert point["results"]["infinite"]["host_hit_rate"] == pytest.approx(1.0)
        assert point["results"]["lru"]["turns"] > 60
    assert large["results"]["lru"]["host_hit_rate"] >= small["results"]["lru"]["host_hit_rate"]
