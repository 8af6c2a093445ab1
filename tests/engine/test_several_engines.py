"""Several engines behind a router, at the adapter: decisions fan out to every adapter and each
applies only those of sessions it holds; a session arriving with earlier turns it never saw
is counted as cold (the sidecar counts that as a move). vLLM's real managers, no engine."""

from __future__ import annotations

import pytest

from tenure.service.wire.push import Decision
from tests.engine.test_policy_mapping import key, serve, tenure_manager

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    from tenure.engine_adapter.plugin import register

    register()


def _finished(seq: int, session: str) -> Decision:
    return Decision(seq=seq, session_id=session, state="finished", turn=9, last_turn=True)


def test_moved_session_is_cold_and_foreign_decisions_change_nothing():
    a, b = tenure_manager(16), tenure_manager(16)
    tags = {"session_id": "t/s", "turn": 1, "expected_gap_s": 5.0}
    assert serve(a, "r1", [key(1, 0), key(1, 1)], tags)
    assert serve(a, "r2", [key(1, 0), key(1, 1), key(1, 2)], {**tags, "turn": 2})
    assert a._policy.stats["cold_sessions"] == 0  # turn 1 here, then its own turn 2
    # The router moved the session (engine A died): turn 3 reaches B, which never saw it.
    assert serve(b, "r3", [key(1, 0), key(1, 1), key(1, 2)], {**tags, "turn": 3})
    assert b._policy.stats["cold_sessions"] == 1
    # A session only A holds: its decision reaches B too (fan-out) and changes nothing there.
    assert serve(a, "r4", [key(2, 0)], {"session_id": "t/only-a", "turn": 1})
    before = dict(b._policy.tier.session_resident)
    for manager in (a, b):
        manager._policy.inbox.append(_finished(1, "t/only-a"))
        manager._policy.poll()
    assert b._policy.stats["decisions_foreign"] == 1
    assert dict(b._policy.tier.session_resident) == before
    assert "t/only-a" not in b._policy.sessions.last_hint
    assert a._policy.stats["decisions_foreign"] == 0
    assert "t/only-a" not in a._policy.tier.session_resident  # reclaimed where it lived
