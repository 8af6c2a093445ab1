"""Fail fast while Redis is down: one failure opens the breaker for ``retry_after_s``.

Without it every proxied request would wait out a connect or socket timeout while Redis is
unreachable; with it the proxy fails open at once and lifecycle routes answer 503 with a
``Retry-After`` the breaker supplies. The first call after the delay probes Redis again, so the
service recovers without a restart.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.exceptions

__all__ = ["Breaker", "StateUnavailable"]

T = TypeVar("T")


class StateUnavailable(Exception):
    """Redis cannot be used right now; try again after ``retry_after_s``."""

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Breaker:
    def __init__(
        self,
        retry_after_s: float,
        *,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry_after_s = retry_after_s
        self._on_error = on_error
        self._clock = clock
        self._open_until = 0.0

    @property
    def is_open(self) -> bool:
        return self._clock() < self._open_until

    def remaining_s(self) -> float:
        return max(0.0, self._open_until - self._clock())

    async def call(self, op: str, make: Callable[[], Awaitable[T]], *, patient: bool = False) -> T:
        """``make()`` unless the breaker is open; a failure opens it.

        A ``patient`` call (an operator's or a client's write that someone waits on, never a
        proxied request) goes to Redis even while the breaker is open, and its success closes
        the breaker. One timeout opens the breaker so that proxied requests stop waiting on
        Redis; but on a busy host a single reply late by a socket timeout is no outage, and an
        admin write answered 503 for a second because a background read was slow (what a
        loaded 2-core machine did to ``POST /admin/waits``) is a failure the breaker made up.
        """
        if self.is_open and not patient:
            raise StateUnavailable("state store unavailable", retry_after_s=self.remaining_s())
        try:
            result = await make()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            self._open_until = self._clock() + self.retry_after_s
            if self._on_error is not None:
                self._on_error(op)
            raise StateUnavailable(
                f"state store unavailable ({type(exc).__name__})",
                retry_after_s=self.retry_after_s,
            ) from exc
        except redis.exceptions.BusyLoadingError as exc:  # pragma: no cover - subclass above
            raise StateUnavailable("state store loading", retry_after_s=1.0) from exc
        if patient:
            self._open_until = 0.0  # Redis answered: proxied requests may use it again
        return result
