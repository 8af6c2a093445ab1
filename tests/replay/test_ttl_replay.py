"""``tenure replay ttl``: the finite-capacity replay, Table 6 cells, the drift day, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tenure.service.cli import main
from tenure.service.policy.host_loss import episode_cost
from tenure.service.policy.platforms import PLATFORMS
from tenure.service.policy.retention_costs import RetentionModel
from tenure.service.replay import ttl_diagnose
from tenure.service.replay.paths import claude_code_trace
from tenure.service.replay.ttl_drift import DriftPhase, DriftSpec, run_drift
from tenure.service.replay.ttl_families import human_turn_gaps, synthetic_family
from tenure.service.replay.ttl_sim import FixedTimer, poisson_arrivals, replay_policy, replay_timers
from tenure.service.replay.ttl_table6 import FIXED_TIMERS, Table6Spec, run_table6

PRICE = PLATFORMS["h100-nvl"].price
MODEL = RetentionModel(PRICE, 425, 1800.0)


@pytest.mark.parametrize("family", ["lognormal", "exponential", "mixture"])
def test_families_are_scaled_to_w_ref(family: str) -> None:
    waits = synthetic_family(family, 1800.0).sample(200_000, np.random.default_rng(0))
    assert waits.mean() == pytest.approx(1800.0, rel=0.02)
    assert waits.min() >= 0


def test_event_replay_timer_replay_and_core_calibration_replay_agree() -> None:
    """Three paths through one admission rule give identical costs (one physics)."""
    rng = np.random.default_rng(1)
    lam = 3 * MODEL.lambda_crit
    arrivals = poisson_arrivals(3000, lam, rng)
    waits = synthetic_family("mixture", 1800.0).sample(3000, rng)
    ttl = MODEL.t2(lam)
    timed = replay_timers(arrivals, waits, np.full(3000, ttl), 425, PRICE)
    evented = replay_policy(arrivals, waits, FixedTimer(ttl), 425, PRICE)
    core = episode_cost(arrivals.tolist(), waits.tolist(), ttl, 425, PRICE)
    assert timed.mean_cost == pytest.approx(evented.mean_cost)
    assert timed.mean_cost == pytest.approx(core.cost)
    counts = timed.outcome_counts(waits)
    assert (counts["host_hits"], counts["expired"], counts["rejected"]) == (
        core.host_hits,
        core.expired,
        core.rejected,
    )


def test_uncongested_costs_follow_from_the_wait_distribution_alone() -> None:
    """At 0.5 x lambda_crit nothing is refused: retain pays beta2 per context, a 10-minute
    timer pays beta3 for each wait over 600 s (for exponential waits, a share exp(-1/3))."""
    rng = np.random.default_rng(2)
    lam = 0.5 * MODEL.lambda_crit
    arrivals = poisson_arrivals(4000, lam, rng)
    waits = synthetic_family("exponential", 1800.0).sample(4000, rng)
    retain = replay_timers(arrivals, waits, np.full(4000, np.inf), 425, PRICE)
    ten = replay_timers(arrivals, waits, np.full(4000, 600.0), 425, PRICE)
    assert retain.mean_cost == pytest.approx(PRICE.beta2)
    expected = PRICE.beta2 + math.exp(-1 / 3) * (PRICE.beta3 - PRICE.beta2)
    assert ten.mean_cost == pytest.approx(expected, rel=0.03)


def test_table6_cells_have_the_documented_shape_and_sane_orderings() -> None:
    spec = Table6Spec(
        MODEL,
        [synthetic_family("mixture", 1800.0)],
        loads=(0.5, 3.0),
        requests=4000,
        # The seed's calibration replays its sample as one finite episode from an empty tier;
        # with much fewer than ~4,000 waits the start-up dominates and retain looks best.
        calibration_samples=4000,
        calibration_load=3.0,
        replicates=1,
    )
    cells = run_table6(spec)
    assert [c["load"] for c in cells] == [0.5, 3.0]
    for cell in cells:
        assert {"family", "load", "controller_branch", "controller_cost", "best_fixed_name",
                "best_fixed_cost", "costs"} <= set(cell)  # fmt: skip
        assert cell["best_fixed_cost"] == min(cell["costs"][n] for n in FIXED_TIMERS)
        assert cell["seed"]["branch"] == "ttl"  # the seed's row rides along
    calm, busy = cells
    assert calm["costs"]["inf"] == pytest.approx(PRICE.beta2)
    # The mixture at 3 x crit: load-indexed expiry beats host-retain, as in the seed.
    assert busy["controller_branch"] == "ttl"
    assert busy["costs"]["cpu_ttl"] < busy["costs"]["inf"]


def test_drift_day_hindsight_is_no_worse_than_any_fixed_timer() -> None:
    phases = (
        DriftPhase("calm", 0, 2, 0.5, 0.5, "lognormal"),
        DriftPhase("busy", 2, 4, 0.5, 3.0, "mixture", ramp_h=0.5),
    )
    families = {n: synthetic_family(n, 1800.0) for n in ("lognormal", "mixture")}
    spec = DriftSpec(
        MODEL, families, phases, estimators=("changepoint:300",), calibration_samples=1000,
        replicates=1, ablations=False,
    )  # fmt: skip
    drift = run_drift(spec)
    assert {"online_cost", "oneshot_cost", "hindsight_cost", "fixed"} <= set(drift)
    assert drift["hindsight_cost"] <= min(drift["fixed"].values()) + 1e-12
    assert drift["hindsight_choice"][0]["calm"] == "inf"  # nothing to gain from expiry there
    assert spec.load_at(2.25 * 3600) == pytest.approx(1.75)  # half-way up the ramp


def test_claude_code_human_gaps_are_split_by_session() -> None:
    trace = claude_code_trace()
    if not trace.is_file():
        pytest.skip("the shared Claude Code trace is not present")
    gaps = human_turn_gaps(trace)
    assert len(gaps.calibration) > 1000 and len(gaps.heldout) > 1000
    assert gaps.sessions == 506
    assert 100 < float(np.median(np.concatenate([gaps.calibration, gaps.heldout]))) < 200
    # Issue 13's family: each half scaled to W_ref by its own mean.
    family = gaps.family(1800.0, "half")
    sample = family.sample(50_000, np.random.default_rng(0), "heldout")
    assert sample.mean() == pytest.approx(1800.0, rel=0.1)
    # The default: one time unit for both halves (the raw ratio of their gaps survives).
    pooled = gaps.family(1800.0)
    rng = np.random.default_rng(0)
    cal = pooled.sample(50_000, rng, "calibration")
    held = pooled.sample(50_000, rng, "heldout")
    ratio = float(gaps.calibration.mean() / gaps.heldout.mean())
    assert float(cal.mean() / held.mean()) == pytest.approx(ratio, rel=0.1)
    both = (cal.mean() * len(gaps.calibration) + held.mean() * len(gaps.heldout)) / (
        len(gaps.calibration) + len(gaps.heldout)
    )
    assert both == pytest.approx(1800.0, rel=0.1)
    with pytest.raises(ValueError, match="scaling"):
        gaps.family(1800.0, "per-half")


def test_cli_writes_json_table_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "ttl.json", tmp_path / "ttl.png"
    rc = main([
        "replay", "ttl", "--families", "mixture", "--loads", "3", "--requests", "800",
        "--calibration-samples", "800", "--replicates", "1", "--no-drift",
        "--json", str(out), "--plot", str(png),
    ])  # fmt: skip
    assert rc == 0
    doc = json.loads(out.read_text())
    (cell,) = doc["cells"]
    assert cell["family"] == "mixture" and cell["load"] == 3.0
    assert set(FIXED_TIMERS) | {"cpu_ttl", "controller"} <= set(cell["costs"])
    assert png.stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "ours" in printed and "seed" in printed
    assert doc["config"]["online"]["timer"] == "repriced"


def test_cli_timer_oneshot_makes_est_lam_the_one_shot_column(tmp_path: Path) -> None:
    """``--timer oneshot`` is the seed's timer with an estimated lambda: the est-lam column then
    equals the one-shot column, while the default re-prices (and differs on a congested cell)."""
    # 4,000 calibration waits: the ttl branch, where a timer can be re-priced.
    argv = [
        "replay", "ttl", "--families", "mixture", "--loads", "2", "--requests", "1500",
        "--calibration-samples", "4000", "--replicates", "1", "--no-drift",
    ]  # fmt: skip
    costs = {}
    for timer in ("oneshot", "repriced"):
        out = tmp_path / f"{timer}.json"
        assert main([*argv, "--timer", timer, "--json", str(out)]) == 0
        (cell,) = json.loads(out.read_text())["cells"]
        costs[timer] = cell["costs"]
    one, re = costs["oneshot"], costs["repriced"]
    assert one["controller_est"] == one["controller_est_oneshot"]
    assert re["controller_est_oneshot"] == one["controller_est_oneshot"]
    assert re["controller_est"] != re["controller_est_oneshot"]
    assert re["controller"] == one["controller"]  # configured lambda: nothing to re-price


def test_cli_spread_seeds_rerun_the_table_per_base_seed(tmp_path: Path) -> None:
    """``--spread-seeds``: each base seed is a whole independent Table 6; the spread of a
    cell's gain is over those runs, and the base seed's own run is the printed table."""
    out = tmp_path / "ttl.json"
    argv = [
        "replay", "ttl", "--families", "mixture", "--loads", "2", "--requests", "800",
        "--calibration-samples", "800", "--replicates", "1", "--no-drift",
    ]  # fmt: skip
    assert main([*argv, "--spread-seeds", "3,0,3", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    spread = doc["seed_spread"]
    assert spread["seeds"] == [0, 3]
    (cell,) = spread["cells"]
    gains = cell["controller"]["per_seed"]
    assert gains[0] == doc["cells"][0]["gain"]["controller"]
    alone = tmp_path / "seed3.json"
    assert main([*argv, "--seed", "3", "--json", str(alone)]) == 0
    assert gains[1] == json.loads(alone.read_text())["cells"][0]["gain"]["controller"]
    assert cell["controller"]["min"] == min(gains) and cell["controller"]["max"] == max(gains)
    assert cell["controller"]["short_of_target"] == sum(g < -0.005 for g in gains)
    assert cell["online"]["short_of_target"] is None


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--families", "weibull"], "unknown wait family"),
        (["--c2", "0"], "--c2"),
        (["--c2", "1.5"], "--c2"),
        (["--w-ref", "-3"], "--w-ref"),
        (["--loads", "2,nan"], "--loads"),
        (["--price", "0.02,0.5,0.1"], "beta3"),
        (["--price", "0,0.02,1.9"], "alpha1"),
        (["--price", "0.02,x,1.9"], "beta2"),
        (["--platform", "tpu"], "unknown platform"),
        (["--estimator", "median:9"], "--estimator"),
        (["--json", "/nonexistent/dir/x.json"], "does not exist"),
        (["--spread-seeds", "1,x"], "--spread-seeds"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", "ttl", "--families", "mixture", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_diagnosis_of_a_cell_runs_and_its_parts_are_consistent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    model = RetentionModel(PRICE, 425, 1800.0)
    mixture = synthetic_family("mixture", 1800.0)
    rows = {r["timer"]: r for r in ttl_diagnose.timer_curve(model, mixture, 2.0, 2, 1500, 0)}
    assert rows["30min"]["vs_30min"] == 0.0
    for row in rows.values():  # every context is counted once, whatever its timer
        assert row["host_hits"] + row["expired"] + row["refused"] == pytest.approx(1500)
    assert rows["inf"]["expired"] == 0 and rows["10min"]["refused"] <= rows["inf"]["refused"]
    spread = ttl_diagnose.calibration_spread(model, mixture, 2.0, [1000], [1, 16], 4, 0)
    assert [r["draws"] for r in spread] == [1, 16]
    assert spread[1]["sd"] < spread[0]["sd"]
    assert ttl_diagnose.main(["--reps", "1", "--requests", "600", "--only", "lambda"]) == 0
    assert "warmed by 1 h" in capsys.readouterr().out
