"""The sessions one engine serves: the per-session tables the policy's parts share."""

from __future__ import annotations

from dataclasses import dataclass, field

from tenure.service.policy import SessionHint

__all__ = ["Sessions"]


@dataclass(slots=True)
class Sessions:
    """Which sessions this engine holds, which ended, and the hint each last gave the core.

    Filled by :class:`~tenure.engine_adapter.requests.Requests` (request starts) and
    :class:`~tenure.engine_adapter.pushed.Pushed` (the sidecar's decisions); read by
    :class:`~tenure.engine_adapter.holdings.Holdings` (a reclaimed block goes to a live sharer
    only).
    """

    #: Sessions that sent a request to this engine: with several engines behind a router
    #: every adapter receives every decision and applies only those of sessions it holds.
    held: set[str] = field(default_factory=set)
    #: Sessions whose last turn was declared (their blocks are not inherited).
    ended: set[str] = field(default_factory=set)
    #: The hint each live session last gave the core (a repeat is not told again).
    last_hint: dict[str, SessionHint] = field(default_factory=dict)
