"""Re-priced host timers at the adapter, through vLLM's real offloading manager (no engine).

A suspended session's host copy has a limit on its tenant's rent clock; every snapshot brings
the clock. A higher rent rate expires the copy earlier than its original timer, a zero rate
keeps it past that timer, an old-style decision (no limit) keeps the timer it was given, and
bad rent fields are counted and ignored. Times are driven explicitly (wall = monotonic here).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tenure.service.policy.platforms import PLATFORMS
from tenure.service.policy.rent import rent_budget
from tenure.service.wire.push import Decision, RetentionState, Snapshot, TierConfig
from tests.engine.test_policy_mapping import key, serve, tenure_manager

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

BUDGET = rent_budget(PLATFORMS["h100-nvl"].price)  # beta3 - beta2, GPU-s
RATE = BUDGET / 100.0  # a 100 s timer at this price
T0 = 1_000_000.0
SESSION = "acme/s"
BLOCKS = [key(1, 0), key(1, 1)]


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
    manager = tenure_manager(16)
    policy = manager.tenure
    clock = Clock()
    policy.set_clocks(clock, clock)
    policy.resumes._wall = clock
    assert serve(manager, "r1", BLOCKS, {"session_id": SESSION, "turn": 1})
    assert policy.resident_blocks(SESSION) == len(BLOCKS)
    return manager, policy, clock


def _snapshot(at: float, accrued: float, rate: float, seq: int = 1, **extra: Any) -> Snapshot:
    state = RetentionState(rent_accrued=accrued, rent_at=at, rent_rate=rate, **extra)
    return Snapshot(seq=seq, decisions=[], config=TierConfig(retention={"acme": state}),
                    issued_at=at)  # fmt: skip


def _suspend(at: float, limit: float | None, ttl: float | None = 100.0) -> Decision:
    return Decision(seq=1, session_id=SESSION, state="suspended", host_ttl_s=ttl,
                    host_rent_limit=limit, issued_at=at, reason="host_ttl")  # fmt: skip


def _push(policy: Any, clock: Clock, at: float, *messages: Snapshot | Decision) -> None:
    clock.now = at
    policy.inbox.extend(messages)
    policy.poll(at)


def _held_until(policy: Any, clock: Clock, start: float, stop: float) -> float:
    """The first whole second in [start, stop) at which the copy is gone (``inf``: never)."""
    t = start
    while t < stop:
        clock.now = t
        policy.poll(t)
        if policy.resident_blocks(SESSION) == 0:
            return t
        t += 1.0
    return math.inf


def test_a_higher_rent_rate_expires_the_copy_earlier_and_the_resume_reports_it() -> None:
    manager, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, BUDGET))
    # Twenty seconds at the old price, then twice the rent: 80 s of budget left at 2 x the
    # rate is 40 s, so the copy goes at T0 + 60 instead of T0 + 100.
    _push(policy, clock, T0 + 20, _snapshot(T0 + 20, 20 * RATE, 2 * RATE))
    assert policy.stats["ttl_repriced"] == 1
    gone = _held_until(policy, clock, T0 + 21, T0 + 200)
    assert gone == T0 + 60
    assert policy.stats["ttl_expiries"] == 1 and policy.stats["evicted_blocks_ttl"] == 2
    # The resume after it is a recompute, held for the re-priced 60 s (not the issued 100).
    clock.now = T0 + 150
    serve(manager, "r2", BLOCKS, {"session_id": SESSION, "turn": 2})
    (outcome,) = policy.resumes.drain()
    assert (outcome.branch, outcome.outcome, outcome.tenant) == ("ttl", "recomputed", "acme")
    assert outcome.host_held_s == pytest.approx(60.0)
    assert outcome.wait_s == pytest.approx(150.0)


def test_a_zero_rate_keeps_the_copy_past_its_timer_until_the_price_rises() -> None:
    _, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, BUDGET))
    _push(policy, clock, T0 + 20, _snapshot(T0 + 20, 20 * RATE, 0.0))  # congestion gone
    assert _held_until(policy, clock, T0 + 21, T0 + 300) == math.inf  # 3 x past T0 + 100
    assert policy.stats["ttl_expiries"] == 0
    # The price comes back: 80 s of budget left at the old rate.
    _push(policy, clock, T0 + 300, _snapshot(T0 + 300, 20 * RATE, RATE))
    assert policy.stats["ttl_repriced"] == 2
    assert _held_until(policy, clock, T0 + 301, T0 + 500) == T0 + 380


def test_small_moves_and_repeated_snapshots_do_not_re_hint() -> None:
    _, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, BUDGET))
    # The same clock again, then a rate 0.5% higher (moves the expiry by ~0.4 s < 1 s).
    _push(policy, clock, T0 + 10, _snapshot(T0, 0.0, RATE))
    _push(policy, clock, T0 + 20, _snapshot(T0 + 20, 20 * RATE, 1.005 * RATE))
    assert policy.stats["ttl_repriced"] == 0
    assert _held_until(policy, clock, T0 + 21, T0 + 200) == T0 + 100


def test_a_limit_already_reached_expires_at_the_snapshot() -> None:
    _, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, BUDGET))
    # The rent a lease holder charged in the meantime passed the limit (a surge).
    _push(policy, clock, T0 + 30, _snapshot(T0 + 30, BUDGET * 1.5, RATE))
    assert policy.resident_blocks(SESSION) == 0
    assert policy.stats["ttl_expiries"] == 1 and policy.stats["ttl_repriced"] == 1


def test_an_old_style_decision_keeps_its_timer_whatever_the_clock_says() -> None:
    _, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, None))
    _push(policy, clock, T0 + 20, _snapshot(T0 + 20, 20 * RATE, 10 * RATE))
    assert policy.stats["ttl_repriced"] == 0
    assert _held_until(policy, clock, T0 + 21, T0 + 200) == T0 + 100


def test_without_a_clock_a_decision_with_a_limit_behaves_as_before() -> None:
    # An older sidecar: its snapshot's retention state has no clock (rent_at None).
    _, policy, clock = _engine()
    old = Snapshot(seq=1, decisions=[], config=TierConfig(retention={"acme": RetentionState()}),
                   issued_at=T0)  # fmt: skip
    _push(policy, clock, T0, old, _suspend(T0, BUDGET))
    _push(policy, clock, T0 + 20, old)
    assert policy.stats["ttl_repriced"] == 0
    assert _held_until(policy, clock, T0 + 21, T0 + 200) == T0 + 100


def test_a_decision_newer_than_the_clock_keeps_its_own_timer_until_the_next_snapshot() -> None:
    _, policy, clock = _engine()
    # The adapter's clock is from T0 at a low rate; the sidecar re-priced at T0 + 5 and
    # issued the suspension at T0 + 10 with a 50 s timer (twice the rate).
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE / 2))
    limit = 5 * RATE / 2 + 5 * 2 * RATE + BUDGET  # R(T0 + 10) on the sidecar's clock, + budget
    _push(policy, clock, T0 + 10, _suspend(T0 + 10, limit, ttl=50.0))
    assert policy.stats["ttl_repriced"] == 0
    # The next snapshot brings the clock the decision was priced with: nothing moves.
    _push(policy, clock, T0 + 15, _snapshot(T0 + 5, 5 * RATE / 2, 2 * RATE))
    assert policy.stats["ttl_repriced"] == 0
    assert _held_until(policy, clock, T0 + 16, T0 + 200) == T0 + 60


@pytest.mark.parametrize(
    "fields",
    [
        {"rent_rate": math.nan}, {"rent_rate": -1.0}, {"rent_rate": math.inf},
        {"rent_accrued": math.nan}, {"rent_accrued": -5.0}, {"rent_at": math.inf},
    ],
)  # fmt: skip
def test_bad_rent_fields_in_a_snapshot_are_counted_and_ignored(fields: dict[str, Any]) -> None:
    _, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, BUDGET))
    good: dict[str, Any] = {"rent_accrued": 20 * RATE, "rent_at": T0 + 20, "rent_rate": 2 * RATE}
    state = RetentionState(**{**good, **fields})
    bad = Snapshot(seq=1, decisions=[], config=TierConfig(retention={"acme": state}),
                   issued_at=T0 + 20)  # fmt: skip
    _push(policy, clock, T0 + 20, bad)
    assert policy.stats["rent_bad_fields"] == 1 and policy.stats["ttl_repriced"] == 0
    assert _held_until(policy, clock, T0 + 21, T0 + 200) == T0 + 100  # the good clock's timer


@pytest.mark.parametrize("limit", [math.nan, -1.0, math.inf])
def test_a_bad_limit_in_a_decision_is_counted_and_its_ttl_applies(limit: float) -> None:
    _, policy, clock = _engine()
    _push(policy, clock, T0, _snapshot(T0, 0.0, RATE), _suspend(T0, limit, ttl=30.0))
    _push(policy, clock, T0 + 5, _snapshot(T0 + 5, 5 * RATE, 0.0))
    assert policy.stats["rent_bad_fields"] == 1 and policy.stats["ttl_repriced"] == 0
    assert _held_until(policy, clock, T0 + 6, T0 + 200) == T0 + 30


def test_frames_of_older_peers_decode_with_no_limit_and_no_clock() -> None:
    import msgspec

    from tenure.service.wire.push import decode

    old = {"type": "decision", "seq": 3, "session_id": "acme/s", "state": "suspended",
           "host_ttl_s": 30.0}  # fmt: skip
    decision = decode(msgspec.msgpack.encode(old))
    assert isinstance(decision, Decision) and decision.host_rent_limit is None
    snap = {"type": "snapshot", "seq": 3, "decisions": [old],
            "config": {"retention": {"acme": {"branch": "ttl", "host_ttl_s": 30.0}}}}  # fmt: skip
    state = decode(msgspec.msgpack.encode(snap))
    assert isinstance(state, Snapshot)
    assert state.config.retention["acme"].rent_at is None
    assert state.config.retention["acme"].rent_rate == 0.0
