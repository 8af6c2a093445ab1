"""The soak's ledger check and figures: what counts as a lost acknowledged write, what is
inside the failover window, and the growth slope (no stack needed)."""

from __future__ import annotations

import json
from pathlib import Path

from tenure.benchmarks.soak.ledger import Ledger, TurnRecord
from tenure.benchmarks.soak.report import _slope_per_hour, flatness, rerender, summarize


def test_lost_writes_are_split_by_the_failover_window():
    ledger = Ledger()
    ledger.ack("kept", 1.0, "suspended", 3)
    ledger.ack("moved-on", 2.0, "suspended", 3)  # a later turn legitimately changed the state
    ledger.ack("lost-early", 5.0, "finished", 4)
    ledger.ack("lost-late", 9.7, "suspended", 2)
    records = {
        "kept": {"state": "suspended", "turn": 3},
        "moved-on": {"state": "active", "turn": 4},
        "lost-early": {"state": "idle", "turn": 4},
        "lost-late": None,
    }
    checks = ledger.check(records, master_kills=[10.0], window_s=1.0)
    assert checks["acknowledged_writes"] == 4
    assert checks["acknowledged_writes_lost"] == 1 and checks["lost_sessions"] == ["lost-early"]
    assert checks["acknowledged_writes_lost_in_window"] == 1
    assert checks["ledger_mismatches"] == 1


def test_summary_excuses_failures_only_while_an_engine_or_replica_is_down():
    ledger = Ledger()
    ledger.turns = [
        TurnRecord(1.0, "a", 200, 0.01, 0),
        TurnRecord(20.5, "a", 0, 0.01, 1, retried_ok=True),  # replica down, the retry served it
        TurnRecord(21.0, "b", 502, 0.01, 0),  # inside the engine window
        TurnRecord(40.0, "b", 500, 0.01, 0),  # a Redis failover must not fail a request
    ]
    faults = [
        {"kind": "sidecar_killed", "at_s": 20.0, "healed_s": 20.8},
        {"kind": "engine_killed", "at_s": 20.9, "healed_s": 22.0},
        {"kind": "redis_master_killed", "at_s": 39.0, "healed_s": 41.0},
    ]
    result = summarize(
        args={"engine": "fake", "minutes": 1, "sessions_per_s": 1}, ledger=ledger,
        checks=ledger.check({}, [], 1.0), faults=faults, samples=[], duration_s=60, slack_s=1.0,
        engines=[], moves=0,
    )  # fmt: skip
    assert result["proxied_success_ratio"] == 0.5
    assert result["first_attempt_success_ratio"] == 0.25
    assert result["proxied_success_ratio_outside_faults"] == 0.5  # the Redis-window failure


def test_growth_slope_is_per_hour():
    assert _slope_per_hour([(0, 100.0), (60, 101.0), (120, 102.0)]) == 60.0
    assert _slope_per_hour([(0, 1.0), (1, 1.0)]) is None


def _samples(minutes: int, redis, rss) -> list[dict[str, float]]:
    return [
        {"t": float(t), "redis_mib": redis(t), "rss_mib_0": rss(t), "rss_mib_1": rss(t)}
        for t in range(0, minutes * 60 + 1, 5)
    ]


def test_a_curve_still_rising_over_the_last_half_hour_is_not_called_flat():
    """Issue 23: the report must say when a curve has not flattened. A Redis that fills for
    the first 20 minutes and then holds is flat; one that keeps rising 1 MiB per 10 minutes
    at a 10 MiB level is not (a 30% rise over the window), and neither is an RSS that steps
    up late in the run."""
    plateau = _samples(60, lambda t: min(t, 1200) / 120, lambda t: 80.0)
    flat = flatness(plateau, [], 3600)
    assert flat["window_s"] == [1800.0, 3600.0]
    assert flat["not_flattened"] == []
    assert all(c["flat"] for c in flat["curves"].values())
    rising = _samples(60, lambda t: 7.0 + t / 600, lambda t: 80.0 + (6.0 if t > 3000 else 0.0))
    verdict = flatness(rising, [], 3600)
    assert verdict["not_flattened"] == ["Redis used_memory", "sidecar-0 RSS", "sidecar-1 RSS"]
    assert verdict["curves"]["Redis used_memory"]["slope_mib_per_hour"] == 6.0


def test_a_restarted_replica_and_a_promoted_redis_start_new_curves():
    """A replica restarted inside the window is judged from its restart (its fresh process's
    RSS climbing back is not a leak); the Redis promoted by a failover likewise."""
    rows = _samples(60, lambda t: 5.0 if t > 2010 else 50.0, lambda t: 80.0)
    for row in rows:
        if row["t"] < 2000:
            row["rss_mib_1"] = 120.0
    faults = [
        {"kind": "sidecar_killed", "at_s": 1990.0, "healed_s": 2000.0},
        {"kind": "redis_master_killed", "at_s": 1999.0, "healed_s": 2000.0},
    ]
    assert flatness(rows, faults, 3600)["not_flattened"] == []
    assert flatness(rows, [], 3600)["not_flattened"] == ["Redis used_memory", "sidecar-1 RSS"]


def test_a_saved_run_is_re_rendered_with_the_current_rules(tmp_path: Path):
    result = {"engine": "fake", "minutes": 10, "sessions_per_s": 0.5, "turns": 0, "faults": [],
              "proxied_success_ratio": 1.0, "acknowledged_writes_lost": 0}  # fmt: skip
    series = {"samples": _samples(10, lambda t: 1.0 + t / 60, lambda t: 80.0), "turns": []}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result))
    path.with_name("run_series.json").write_text(json.dumps(series))
    rerender(path, tmp_path / "run.png")
    saved = json.loads(path.read_text())
    assert saved["plateau"]["window_s"] == [300.0, 600.0]
    assert saved["plateau"]["not_flattened"] == ["Redis used_memory"]
    assert (tmp_path / "run.png").stat().st_size > 0


def test_a_finished_session_past_its_ttl_has_expired_not_lost():
    """Issue 23: a run longer than ``finished_ttl_s`` read back sessions that ended long before
    and had expired by design; the ledger counted each as an acknowledged write lost."""
    ledger = Ledger()
    ledger.ack("old-end", 10.0, "finished", 5)
    ledger.ack("new-end", 3500.0, "finished", 5)
    ledger.ack("suspended", 10.0, "suspended", 2)
    records: dict[str, dict[str, object] | None] = {"old-end": None, "new-end": None,
                                                    "suspended": None}  # fmt: skip
    checks = ledger.check(records, [], 1.0, read_at=3600.0, finished_ttl_s=600.0)
    assert checks["acknowledged_writes_expired"] == 1
    assert checks["acknowledged_writes_lost"] == 2  # a recent end and a suspension: lost


def test_a_session_that_expires_while_the_read_back_runs_has_expired_not_lost():
    """The hour's soak counted 2 ends as lost: they expired between the start of the read-back
    and their own read, tens of seconds later. Each record's own read time counts."""
    ledger = Ledger()
    ledger.ack("ended-at-3000", 3000.0, "finished", 5)
    records: dict[str, dict[str, object] | None] = {"ended-at-3000": None}
    at_start = ledger.check(records, [], 1.0, read_at=3590.0, finished_ttl_s=600.0)
    assert at_start["acknowledged_writes_lost"] == 1
    per_session = ledger.check(
        records, [], 1.0, read_at={"ended-at-3000": 3615.0}, finished_ttl_s=600.0
    )
    assert per_session["acknowledged_writes_expired"] == 1
    assert per_session["acknowledged_writes_lost"] == 0
