"""The adapter's core learns gaps on the paths that drive it, and a stop-blind sidecar gap
yields to what it learned (through vLLM's real offloading manager, no engine)."""

from __future__ import annotations

from typing import Any

import pytest

from tenure.service.policy.gate import TenureGate
from tenure.service.policy.lifecycle import STOP_BLIND
from tenure.service.wire.push import Decision
from tests.engine.test_policy_mapping import key, serve, tenure_manager

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

T0 = 1_000_000.0


@pytest.fixture(scope="module", autouse=True)
def _plugin():
    from tenure.engine_adapter.plugin import register

    register()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _engine() -> tuple[Any, Any, Clock]:
    manager = tenure_manager(64)
    policy = manager.tenure
    clock = Clock()
    policy.set_clocks(clock, clock)
    policy.resumes._wall = clock
    return manager, policy, clock


def _decide(policy: Any, clock: Clock, session: str, reason: str, gap: float) -> None:
    decision = Decision(seq=int(clock.now), session_id=session, state="idle", expected_gap_s=gap,
                        wakeup_at=clock.now + gap, reason=reason, issued_at=clock.now)  # fmt: skip
    policy.inbox.append(decision)
    policy.poll(clock.now)


@pytest.mark.parametrize(("reason", "learned"), [(STOP_BLIND, True), ("predicted_tool", False)])
def test_stop_blind_gap_yields_to_the_learned_one(reason: str, learned: bool) -> None:
    manager, policy, clock = _engine()
    core = policy.core
    assert isinstance(core, TenureGate) and core.learns_gaps
    for turn in range(8):  # one session, 20 s between its calls: the core sees every gap
        clock.now = T0 + 21.0 * turn
        keys = [key(1, i) for i in range(turn + 1)]
        assert serve(manager, f"r{turn}", keys, {"session_id": "acme/s", "turn": turn + 1})
    learner = core._learner
    assert learner is not None and learner.ready("acme/s")
    assert 10.0 < learner.quantile("acme/s", 0.5) < 40.0  # fed on the adapter's own path
    _decide(policy, clock, "acme/s", reason, 3600.0)
    life = core.lives["acme/s"]
    if learned:
        assert life.expected_gap_s is None and life.wakeup is None
        wakeup, _deadline = core._learned["acme/s"] or (0.0, 0.0)
        assert wakeup - life.last_activity < 100.0  # its own ~20 s gaps, not the hour
    else:
        assert life.expected_gap_s == pytest.approx(3600.0)
