"""Turn numbers this replica can forward before Redis has counted the turn ("early forward").

The forwarded ``kv_transfer_params.tenure.turn`` is Redis's count of the session's turns, and
getting it costs the proxy's one Redis round trip before the upstream hop. For a session this
replica has already seen, the next number is known locally: it is one more than the last number
Redis gave (or this replica reserved) for it. The proxy then sends the request upstream and the
turn's Redis script at the same time, and compares the two numbers when Redis answers.

They can differ only when something counted a turn this replica did not see: another replica
served the session (a load balancer that is not session-sticky), or Redis lost its data. A
session that differs once is marked *shared* and goes back to the exact path (wait for Redis,
then forward) for as long as this replica remembers it, so a wrong number is forwarded at most
once per session. Redis's count is what every stored record, guard and decision uses either way;
only the number carried in the forwarded request is a forecast.

The table is bounded (least recently used sessions are forgotten, then take the exact path once
more) and lives in one event loop (no locking).
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["TurnForecasts"]

#: Marks a session whose turns are also counted elsewhere (never forecast again).
_SHARED = -1


class TurnForecasts:
    def __init__(self, max_sessions: int = 65_536) -> None:
        if max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        self._max = max_sessions
        self._last: OrderedDict[tuple[str, str], int] = OrderedDict()
        #: Turns on the exact path still waiting for Redis, per session: no forecast until they
        #: are counted (a forecast made meanwhile would take a number one of them gets).
        self._exact: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._last)

    def reserve(self, tenant: str, session: str) -> int | None:
        """The number to forward for the session's next turn, or None: ask Redis first.

        Every call must be followed by :meth:`settle` with what it returned.
        """
        key = (tenant, session)
        last = self._last.get(key)
        if last is None or last == _SHARED or key in self._exact:
            self._exact[key] = self._exact.get(key, 0) + 1
            return None
        self._last[key] = last + 1
        self._last.move_to_end(key)
        return last + 1

    def settle(self, tenant: str, session: str, forecast: int | None, counted: int | None) -> bool:
        """Record Redis's number for a reserved turn (None: Redis failed and did not count it).

        Returns False when a forecast was made and Redis counted a different number.
        """
        key = (tenant, session)
        shared = self._last.get(key) == _SHARED
        if forecast is None:
            pending = self._exact.pop(key, 1) - 1
            if pending:
                self._exact[key] = pending
            if counted is not None and not shared:
                self._remember(key, max(counted, self._last.get(key, 0)))
            return True
        if counted is None:
            if not shared:  # the reserved number was never counted: start over from Redis
                self._last.pop(key, None)
            return True
        if counted != forecast:
            self._remember(key, _SHARED)
            return False
        return True

    def forget(self, tenant: str, session: str) -> None:
        """Redis's count of the session went back (a failed turn was taken back): its next
        turn asks Redis first again, as on first contact. A shared session stays shared."""
        key = (tenant, session)
        if self._last.get(key) != _SHARED:
            self._last.pop(key, None)

    def _remember(self, key: tuple[str, str], value: int) -> None:
        self._last[key] = value
        self._last.move_to_end(key)
        while len(self._last) > self._max:
            self._last.popitem(last=False)
