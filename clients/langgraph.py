"""LangGraph human-in-the-loop gates suspend and resume the Tenure session by themselves.

``interrupt(value)`` in a LangGraph node pauses the graph until a human answers
(``Command(resume=...)``). Calling :func:`interrupt` from here instead does the same and tells
the sidecar: the pause suspends the session with its expected wait (so the sidecar keeps the
KV on the host tier with a TTL fitted to that wait), and the resume resumes it. LangGraph
re-runs an interrupted node from its start on resume, where ``interrupt`` returns the human's
answer at once; the session is suspended only when the graph really pauses::

    from tenure.clients.langgraph import interrupt

    def approve(state):
        answer = interrupt(session, {"question": "apply the patch?"}, expected_wait_s=600)
        ...

Optional extra: ``pip install 'tenure[langgraph]'``.
"""

from __future__ import annotations

from typing import Any

from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt as _langgraph_interrupt

from tenure.clients.async_session import AsyncTenureSession
from tenure.clients.errors import TenureLifecycleError
from tenure.clients.session import TenureSession

__all__ = ["ainterrupt", "interrupt"]

_REASON = "human approval (LangGraph interrupt)"


def interrupt(
    session: TenureSession,
    value: Any,
    *,
    expected_wait_s: float | None = None,
    reason: str = _REASON,
) -> Any:
    """``langgraph.types.interrupt(value)``, suspending ``session`` while the graph waits."""
    try:
        answer = _langgraph_interrupt(value)
    except GraphInterrupt:
        session.suspend(reason=reason, expected_wait_s=expected_wait_s)
        raise
    _resume(session.resume)
    return answer


async def ainterrupt(
    session: AsyncTenureSession,
    value: Any,
    *,
    expected_wait_s: float | None = None,
    reason: str = _REASON,
) -> Any:
    """:func:`interrupt` for an async node and an :class:`AsyncTenureSession`."""
    try:
        answer = _langgraph_interrupt(value)
    except GraphInterrupt:
        await session.suspend(reason=reason, expected_wait_s=expected_wait_s)
        raise
    try:
        await session.resume()
    except TenureLifecycleError as error:
        if error.status != 404:
            raise
    return answer


def _resume(call: Any) -> None:
    try:
        call()
    except TenureLifecycleError as error:
        # The graph resumed after the session record expired: nothing to resume.
        if error.status != 404:
            raise
