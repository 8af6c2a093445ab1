"""Tenure client SDK: agent sessions with lifecycle hints, on the official ``openai`` or
``anthropic`` client.

    from tenure.clients import TenureSession
    with TenureSession(openai_client, session_id="task-42") as s:
        s.chat(model="m", messages=[{"role": "user", "content": "hi"}])

See ``clients/README.md``.
"""

from tenure.clients._core import RetryPolicy, SessionState
from tenure.clients.async_session import AsyncTenureSession
from tenure.clients.errors import TenureError, TenureLifecycleError, TenureUsageError
from tenure.clients.session import TenureSession

__all__ = [
    "AsyncTenureSession",
    "RetryPolicy",
    "SessionState",
    "TenureError",
    "TenureLifecycleError",
    "TenureSession",
    "TenureUsageError",
]
