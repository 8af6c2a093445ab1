"""``tenure bench proxy`` end to end, at a size that runs in seconds: real processes, real JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = {
    "concurrency", "direct_p50_ms", "direct_p99_ms", "proxy_p50_ms", "proxy_p99_ms",
    "added_p50_ms", "added_p99_ms", "direct_rps", "proxy_rps",
}  # fmt: skip


@pytest.mark.slow
def test_bench_proxy_writes_the_issue_json(tmp_path: Path) -> None:
    out, plot = tmp_path / "proxy.json", tmp_path / "latency.png"
    argv = [sys.executable, "-m", "tenure.service.cli", "bench", "proxy", "--concurrency", "4",
            "--requests", "80", "--rounds", "2", "--rate", "200", "--json", str(out),
            "--versus", "TENURE_UPSTREAM_CLIENT=aiohttp", "--plot", str(plot)]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "latency round 2/2" in run.stdout
    result = json.loads(out.read_text())
    assert set(result) >= KEYS
    assert result["concurrency"] == 4 and result["rounds"] == 2
    assert result["proxy_rps"] > 0 and result["direct_rps"] > 0
    assert all(math.isfinite(result[k]) for k in KEYS)
    assert result["added_p50_ms"] == pytest.approx(
        result["proxy_p50_ms"] - result["direct_p50_ms"], abs=0.002
    )
    assert len(result["added_p50_ms_by_round"]) == 2
    versus = result["versus"]
    assert versus["env"] == {"TENURE_UPSTREAM_CLIENT": "aiohttp"}
    assert versus["proxy_rps"] > 0 and math.isfinite(versus["added_p99_ms"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "latencies" not in result  # the raw samples feed the plot, not the JSON


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--rounds", "0"], "--rounds must be >= 1"),
        (["--versus", "X=1"], "TENURE_NAME=VALUE"),
        # A sidecar that cannot start: the error says why, from its log.
        (["--rounds", "1", "--versus", "TENURE_UPSTREAM_MAX_CONNECTIONS=0"], "upstream_max_conn"),
    ],
)
def test_bench_proxy_rejects_bad_arguments(extra: list[str], message: str) -> None:
    argv = [sys.executable, "-m", "tenure.service.cli", "bench", "proxy", *extra]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert message in run.stderr
