"""``tenure bench proxy --route messages``: the messages figures with the same run's chat ones."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

FIGURES = ("proxy_p50_ms", "proxy_p99_ms", "added_p50_ms", "added_p99_ms", "proxy_rps")


def test_bench_proxy_route_messages_reports_chat_alongside(tmp_path: Path) -> None:
    out = tmp_path / "messages.json"
    argv = [sys.executable, "-m", "tenure.service.cli", "bench", "proxy", "--route", "messages",
            "--concurrency", "4", "--requests", "80", "--rounds", "1", "--rate", "200",
            "--json", str(out)]  # fmt: skip
    run = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "chat latency round 1/1" in run.stdout
    assert "messages latency round 1/1" in run.stdout
    result = json.loads(out.read_text())
    assert result["route"] == "messages"
    for figures in (result, result["chat"]):
        assert all(math.isfinite(figures[k]) for k in FIGURES)
        assert figures["proxy_rps"] > 0
    # The sidecar's own histogram was read for the route measured (not chat's twice).
    assert math.isfinite(result["in_sidecar_p50_ms"])
