"""Errors raised by the Tenure client SDK."""

from __future__ import annotations

__all__ = ["TenureError", "TenureLifecycleError", "TenureUsageError"]


class TenureError(Exception):
    """Base class of every error the SDK raises itself (OpenAI errors pass through unchanged)."""


class TenureUsageError(TenureError, ValueError):
    """An invalid request: a bad session id, a negative gap, a call on a finished session."""


class TenureLifecycleError(TenureError):
    """A lifecycle call (end, suspend, resume, spawn, info) failed.

    ``status`` is the sidecar's HTTP status, or ``None`` when the sidecar could not be reached.
    """

    def __init__(self, *, action: str, session_id: str, status: int | None, detail: str) -> None:
        self.action = action
        self.session_id = session_id
        self.status = status
        self.detail = detail
        where = f"HTTP {status}" if status is not None else "sidecar unreachable"
        super().__init__(f"{action} of session {session_id!r} failed ({where}): {detail}")
