"""``tenure bench sdk`` runs and reports its figures (the figures themselves are not asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import sdk as bench


def test_bench_reports_every_figure(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.configure(parser)
    out = tmp_path / "sdk.json"
    args = parser.parse_args(["--calls", "10", "--rounds", "1", "--json", str(out)])
    assert args.func(args) == 0
    result = json.loads(out.read_text())
    assert result["calls_per_round"] == 10
    for key in ("direct_us_per_call", "sdk_us_per_call", "hint_building_us_per_call"):
        assert result[key] > 0, key
    # The three figures are each rounded to 0.01 us (so each is off by up to 0.005): the
    # difference of the rounded two is within 0.015 of the rounded added figure.
    added = result["sdk_us_per_call"] - result["direct_us_per_call"]
    assert result["added_us_per_call"] == pytest.approx(added, abs=0.015 + 1e-9)
