"""Turn-number forecasts for early forwarding (pure: no Redis, no event loop)."""

from __future__ import annotations

import pytest

from tenure.service.api.turns.forecasts import TurnForecasts


def test_first_turn_waits_for_redis_then_turns_are_forecast() -> None:
    f = TurnForecasts()
    assert f.reserve("t", "s") is None
    assert f.settle("t", "s", None, 7)
    assert f.reserve("t", "s") == 8
    assert f.reserve("t", "s") == 9  # two turns in flight get their own numbers
    assert f.settle("t", "s", 8, 8) and f.settle("t", "s", 9, 9)
    assert f.reserve("t", "s") == 10
    # Tenants are separate namespaces.
    assert f.reserve("u", "s") is None


def test_a_wrong_forecast_sends_the_session_back_to_the_exact_path_for_good() -> None:
    f = TurnForecasts()
    f.reserve("t", "s")
    f.settle("t", "s", None, 3)
    assert f.reserve("t", "s") == 4
    assert not f.settle("t", "s", 4, 6)  # another replica counted turns 4 and 5
    for counted in (7, 8):
        assert f.reserve("t", "s") is None
        assert f.settle("t", "s", None, counted)
    assert f.reserve("t", "s") is None


def test_no_forecast_while_an_exact_turn_is_in_flight() -> None:
    f = TurnForecasts()
    assert f.reserve("t", "s") is None  # first contact: exact path, in flight
    assert f.reserve("t", "s") is None  # a concurrent one also waits for Redis
    f.settle("t", "s", None, 1)
    assert f.reserve("t", "s") is None  # the second is still in flight
    f.settle("t", "s", None, 2)
    f.settle("t", "s", None, 3)
    assert f.reserve("t", "s") == 4


def test_a_turn_redis_never_counted_is_not_assumed() -> None:
    f = TurnForecasts()
    f.reserve("t", "s")
    f.settle("t", "s", None, 5)
    assert f.reserve("t", "s") == 6
    assert f.settle("t", "s", 6, None)  # Redis failed: turn 6 was never counted
    assert f.reserve("t", "s") is None  # so the next one asks Redis again
    f.settle("t", "s", None, 6)
    assert f.reserve("t", "s") == 7
    # An exact turn that failed seeds nothing.
    assert f.reserve("t", "x") is None
    f.settle("t", "x", None, None)
    assert f.reserve("t", "x") is None


def test_the_table_is_bounded_least_recently_used_first() -> None:
    f = TurnForecasts(max_sessions=2)
    for s in ("a", "b"):
        f.reserve("t", s)
        f.settle("t", s, None, 1)
    assert f.reserve("t", "a") == 2  # "a" is now the most recent
    f.reserve("t", "c")
    f.settle("t", "c", None, 1)
    assert len(f) == 2
    assert f.reserve("t", "b") is None  # forgotten: exact path again
    with pytest.raises(ValueError):
        TurnForecasts(max_sessions=0)
