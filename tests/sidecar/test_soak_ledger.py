"""The soak's ledger check and figures: what counts as a lost acknowledged write, what is
inside the failover window, and the growth slope (no stack needed)."""

from __future__ import annotations

from benchmarks.soak.ledger import Ledger, TurnRecord
from benchmarks.soak.report import _slope_per_hour, summarize


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
