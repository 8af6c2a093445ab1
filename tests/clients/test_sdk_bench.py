"""``tenure bench sdk`` runs and reports its figures (the figures themselves are not asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tenure.benchmarks import sdk as bench


def test_bench_reports_every_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    out = tmp_path / "sdk.json"
    args = parser.parse_args(["--calls", "10", "--rounds", "1", "--json", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["calls_per_round"] == 10
    for key in ("direct_us_per_call", "sdk_us_per_call", "hint_building_us_per_call"):
        assert result[key] > 0, key
    # The added figure is the bench's own subtraction, so re-deriving it here would only
    # repeat the code; what a reader relies on is that the printed table shows the figures
    # the JSON holds.
    printed = capsys.readouterr().out
    assert f"{result['added_us_per_call']:9.1f} us/call" in printed
    assert f"{result['hint_building_us_per_call']:9.2f} us/call" in printed
