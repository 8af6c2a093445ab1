"""``tenure up`` and ``tenure bench policy``: bad input is one line, exit 2, nothing started."""

from __future__ import annotations

import subprocess

import pytest

from service.stack import TENURE_ARGV


def tenure(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TENURE_ARGV, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--policy", "nope"], "unknown policy 'nope'"),
        (["up", "--port", "70000"], "--port must be a port number"),
        (["bench", "policy", "--policy", "nope"], "unknown policy 'nope'"),
        (["bench", "policy", "--requests", "0"], "must be positive"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    result = tenure(*args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("tenure")]
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in result.stderr


def test_bench_policy_json_has_the_issue_keys(tmp_path) -> None:
    out = tmp_path / "bench.json"
    result = tenure(
        "bench", "policy", "--requests", "200", "--sessions", "20", "--scaling", "10", "50",
        "--repeats", "1", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    data = json.loads(out.read_text())
    assert {"vllm_lru_ns_per_op", "tenure_ns_per_op", "ratio", "scaling"} <= set(data)
    assert data["vllm_lru_ns_per_op"] > 0 and data["tenure_ns_per_op"] > 0
    assert data["ratio"] == pytest.approx(
        data["tenure_ns_per_op"] / data["vllm_lru_ns_per_op"], 0.01
    )
    assert [row["sessions"] for row in data["scaling"]] == [10, 50]
    assert "per call:" in result.stdout and "wrote" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--baseline", "nope"], "unknown policy 'nope'"),
        (["up", "--policy", "lru"], "--policy and --baseline are both 'lru'"),
        (["up", "--sessions", "100000"], "fit the model"),
        (["up", "--trace", "pyproject.toml"], "pyproject.toml"),
        (["up", "--budget-s", "5"], "larger than the time budget"),
        (["up", "--time-scale", "0"], "--time-scale must be a positive number"),
    ],
)
def test_ab_bad_input_is_one_line_exit_2_before_anything_starts(
    args: list[str], needle: str
) -> None:
    result = tenure(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("tenure")]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "starting" not in result.stdout  # no Redis, sidecar or engine was started
