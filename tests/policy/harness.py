"""Small helpers for policy tests: integer sessions, one segment each, explicit clock."""

from __future__ import annotations

from collections.abc import Mapping

from tenure.service.policy import HostTier, Run, SessionHint, StoreResult, create_policy


class Harness:
    """Drives a :class:`HostTier` the way the replay and the adapter do, turn by turn."""

    def __init__(
        self, policy: str, capacity: int, params: Mapping[str, float] | None = None
    ) -> None:
        self.tier = HostTier(create_policy(policy, params), capacity)
        self.length: dict[str, int] = {}

    def seg(self, session: str) -> int:
        return self.tier.segment((session, 0), session)

    def turn(
        self,
        session: str,
        new_blocks: int,
        now: float,
        *,
        gap: float | None = None,
        last: bool = False,
        duration: float = 1.0,
    ) -> StoreResult:
        """One request: start, store its new blocks, finish; hints as a harness sends them."""
        seg = self.seg(session)
        old = self.length.get(session, 0)
        self.length[session] = old + new_blocks
        self.tier.request_start(session, now)
        self.tier.hint(session, SessionHint(expected_gap_s=gap, last_turn=last), now)
        result = self.tier.store([Run(seg, old, old + new_blocks)], session, now)
        self.tier.access([Run(seg, 0, old + new_blocks)], now + duration)
        self.tier.hint(session, SessionHint(expected_gap_s=gap, last_turn=last), now + duration)
        return result

    def resident(self, session: str) -> int:
        return self.tier.resident_blocks(self.seg(session))
