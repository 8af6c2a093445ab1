"""Contract tests run over every registered policy: a new policy is tested by registering it."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from tenure.service.policy import (
    HostTier,
    Run,
    SessionHint,
    TierPolicy,
    create_policy,
    policy_names,
)
from tenure.service.policy.registry import UnknownPolicyError, admission_policy_names, policy_class

CAPACITY = 40


def _policy_state(policy: TierPolicy) -> bytes:
    return policy.fingerprint()


def _tier_state(tier: HostTier) -> Any:
    return (
        tier.used,
        dict(tier.session_resident),
        [bytes(b).rstrip(b"\x00") for b in tier._bitmaps],
    )


def _random_traffic(name: str, seed: int, check: Any) -> HostTier:
    """Agent-like traffic with every kind of hint; ``check(tier, event)`` runs after each step."""
    rng = random.Random(seed)
    tier = HostTier(create_policy(name), CAPACITY)
    lengths: dict[str, int] = {}
    now = 0.0
    for _step in range(300):
        now += rng.expovariate(1.0)
        session = f"s{rng.randrange(8)}"
        seg = tier.segment((session, 0), session)
        old = lengths.get(session, 0)
        new = rng.randint(1, 12)
        lengths[session] = old + new
        tier.request_start(session, now)
        hint = SessionHint(
            expected_gap_s=rng.choice([None, 2.0, 30.0, 300.0]),
            last_turn=rng.random() < 0.1,
            suspended=rng.random() < 0.1,
            host_ttl_s=rng.choice([None, 5.0]),
        )
        tier.hint(session, hint, now)
        runs = [Run(seg, old, old + new)]
        before_tier, before_policy = _tier_state(tier), _policy_state(tier.policy)
        result = tier.store(runs, session, now)
        check(tier, ("store", result, before_tier, before_policy))
        tier.access([Run(seg, 0, old + new)], now + 0.5, inserted=runs if result.admitted else ())
        check(tier, ("access", None, None, None))
        if hint.last_turn:
            lengths[session] = 0
            tier.drop_session(session)
        tier.expire(now + rng.random() * 10)
        check(tier, ("expire", None, None, None))
    return tier


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_capacity_never_exceeded(name: str, seed: int) -> None:
    """Whatever the traffic, the tier never holds more than its capacity."""

    def check(tier: HostTier, event: Any) -> None:
        if tier.capacity is not None:
            assert tier.used <= tier.capacity
        assert tier.used == sum(tier.session_resident.values())

    tier = _random_traffic(name, seed, check)
    assert tier.counters["store_offers"] > 0


@pytest.mark.parametrize("name", policy_names())
def test_refusal_changes_nothing(name: str) -> None:
    """A refused store leaves residency exactly as it was."""
    refusals = 0

    def check(tier: HostTier, event: Any) -> None:
        nonlocal refusals
        kind, result, before_tier, _ = event
        if kind == "store" and not result.admitted:
            refusals += 1
            assert _tier_state(tier) == before_tier
            assert result.victims == ()

    _random_traffic(name, 7, check)
    if name in _ADMISSION_POLICIES:
        assert refusals > 0  # the check above ran on real refusals


#: From the registry: every policy that declares itself an admission gate.
_ADMISSION_POLICIES = set(admission_policy_names())


@pytest.mark.parametrize("name", policy_names())
@pytest.mark.parametrize("seed", [3, 4])
def test_select_victims_is_all_or_nothing(name: str, seed: int) -> None:
    """``select_victims(n)`` frees exactly n resident, unprotected blocks — or changes nothing."""
    rng = random.Random(seed)
    calls = 0

    def check(tier: HostTier, event: Any) -> None:
        nonlocal calls
        if event[0] != "access" or tier.policy.unbounded or tier.used == 0:
            return
        if rng.random() > 0.2:  # deep copies are slow: probe a sample of the states
            return
        calls += 1
        probe = copy.deepcopy(tier)
        owners = sorted(probe.session_resident)
        incoming = rng.choice(owners)
        protected = [Run(s, 0, 1 << 20) for s in probe.segments_of(incoming)]
        n = rng.randint(1, probe.used + 5)
        before = _policy_state(probe.policy)
        victims = probe.policy.select_victims(n, incoming, protected, 1e6)
        if victims is None:
            assert _policy_state(probe.policy) == before
            return
        assert sum(v.run.blocks for v in victims) == n
        seen: set[tuple[int, int]] = set()
        for victim in victims:
            assert probe.owner(victim.run.seg) != incoming
            for index in range(victim.run.start, victim.run.stop):
                assert probe.is_resident(victim.run.seg, index)
                assert (victim.run.seg, index) not in seen
                seen.add((victim.run.seg, index))

    _random_traffic(name, seed, check)
    cls = policy_class(name)
    assert calls > 0 or cls.unbounded or cls.no_capacity


@pytest.mark.parametrize("name", policy_names())
def test_deterministic(name: str) -> None:
    """Same calls, same decisions: no hidden randomness or clock reads."""
    log_a: list[Any] = []
    log_b: list[Any] = []
    _random_traffic(name, 11, lambda t, e: log_a.append((t.used, e[0])))
    _random_traffic(name, 11, lambda t, e: log_b.append((t.used, e[0])))
    assert log_a == log_b


def test_unknown_policy_lists_valid_names() -> None:
    with pytest.raises(UnknownPolicyError, match=r"valid: .*tenure"):
        create_policy("tenur")


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(ValueError, match="no parameter"):
        create_policy("tenure", {"overdue_slackk_s": 1.0})


def test_every_policy_declares_its_sweep_within_its_parameters() -> None:
    for name in policy_names():
        cls = policy_class(name)
        assert set(cls.sweep) <= set(cls.defaults), name
        assert cls.name == name
