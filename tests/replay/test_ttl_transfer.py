"""The transfer oracle (issue 26's ceiling for calibrated rules): small, deterministic runs."""

from __future__ import annotations

import numpy as np
import pytest

from tenure.service.policy.platforms import get_platform
from tenure.service.policy.retention_control import OnlineSettings
from tenure.service.policy.retention_costs import RetentionModel
from tenure.service.policy.retention_rule import timer_for_scale
from tenure.service.replay.ttl_families import synthetic_family
from tenure.service.replay.ttl_table6 import FINE_TIMERS
from tenure.service.replay.ttl_transfer import (
    blind_start_cost,
    first_decision_s,
    law_choice,
    main,
    transfer,
)

MODEL = RetentionModel(get_platform("h100-nvl").price, 425, 1800.0)


def test_a_law_picks_its_least_expected_cost_timer() -> None:
    family = synthetic_family("mixture", MODEL.w_ref_s)
    pick, mean = law_choice(MODEL, family, "calibration", 3 * MODEL.lambda_crit, 300, 2, 0)
    assert set(mean) == set(FINE_TIMERS)
    assert mean[pick] == min(mean.values())


def test_no_pick_beats_the_cells_best_fine_timer() -> None:
    family = synthetic_family("mixture", MODEL.w_ref_s)
    row = transfer(MODEL, family, 3.0, base_seeds=(0, 1), replicates=1, requests=300, episodes=2)
    assert len(row.best_fine) == 2
    for gains, pick in ((row.calibration_gain, row.calibration_pick),
                        (row.heldout_gain, row.heldout_pick)):  # fmt: skip
        for gain, best in zip(gains, row.best_fine, strict=True):
            assert gain <= 0.0
            if pick == best:  # ties (e.g. retain and 6 h on a short episode) may differ
                assert gain == 0.0
    assert row.calibration_pick in row.calibration_within_1pct


def test_a_load_outside_the_table_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--loads", "2.5"])
    assert exc.value.code == 2
    assert "--loads must be among" in capsys.readouterr().err


def test_the_online_rule_first_re_chooses_after_a_period_with_its_sample() -> None:
    settings = OnlineSettings(period_s=900.0, min_samples=200)
    arrivals = np.arange(1000, dtype=float)
    waits = np.full(1000, 10.0)
    assert first_decision_s(arrivals, waits, settings) == 900.0  # 200 resumes by 209 s
    slow = np.full(1000, 2000.0)  # the 200th resume at 2,199 s: the third period's end
    assert first_decision_s(arrivals, slow, settings) == 2700.0
    assert first_decision_s(arrivals[:100], waits[:100], settings) == float("inf")


def test_a_blind_start_on_the_best_timer_costs_what_the_best_timer_does() -> None:
    lam = 3 * MODEL.lambda_crit
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / lam, 2000))
    waits = synthetic_family("mixture", MODEL.w_ref_s).sample(2000, rng, "heldout")
    t0 = timer_for_scale(MODEL, 1.0, lam)
    assert t0 is not None  # congested: scale 1 is a timer
    cost, ref, share = blind_start_cost(MODEL, arrivals, waits, lam, t0, OnlineSettings())
    assert cost == ref
    assert 0.0 < share < 1.0
    cost, ref, _ = blind_start_cost(MODEL, arrivals, waits, lam, 2 * t0, OnlineSettings())
    assert cost != ref
