"""Dependencies injected into routes: the app's services, the caller's tenant, admin auth.

The services are built by the app factory's lifespan and kept on ``app.state``; nothing here
is created at import time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from tenure.service.api.errors import ErrorResponse
from tenure.service.api.segments.tracker import SegmentTracker
from tenure.service.api.tenants import TenantResolver, bearer_token
from tenure.service.api.turns.book import TurnBook
from tenure.service.api.turns.recorder import Recorder
from tenure.service.api.turns.runtime import Runtime
from tenure.service.metrics import Metrics
from tenure.service.push.server import PushServer
from tenure.service.settings import Settings, TenantSpec
from tenure.service.state.store import StateStore

__all__ = [
    "ApiError",
    "Services",
    "error_responses",
    "get_services",
    "require_admin",
    "tenant_of",
]

#: Declares bearer auth in the schema; the checks below read the header themselves.
_admin_bearer = HTTPBearer(
    auto_error=False, scheme_name="AdminToken", description="TENURE_ADMIN_TOKEN"
)
_tenant_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="TenantKey",
    description="a tenant API key (TENURE_TENANTS); not needed without configured tenants",
)
_Credentials = HTTPAuthorizationCredentials | None

_DESCRIPTIONS = {
    400: "the body is not valid JSON",
    401: "missing or unknown API key / admin token",
    404: "no such session (in the caller's tenant)",
    409: "the session is finished, the worker id is taken, or a boundary is out of order "
    "(a worker returning twice, a lead returning, a return before its own workers')",
    413: "the body is larger than TENURE_API_MAX_BODY_BYTES",
    422: "a field, parameter or path segment is invalid (``detail`` lists each with its loc)",
    503: "session state (Redis) is unavailable; retry after Retry-After seconds",
}


class ApiError(HTTPException):
    """An HTTP error of a lifecycle or admin route with its machine-readable ``code``."""

    def __init__(
        self, status: int, message: str, *, code: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status, message, headers=headers)
        self.code = code


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these statuses, all in the one error shape."""
    out: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {"model": ErrorResponse, "description": _DESCRIPTIONS[status]}
        if status == 503:
            entry["headers"] = {
                "Retry-After": {"description": "seconds", "schema": {"type": "string"}}
            }
        out[status] = entry
    return out


@dataclass(slots=True)
class Services:
    settings: Settings
    store: StateStore
    runtime: Runtime
    metrics: Metrics
    tenants: TenantResolver
    clock: Callable[[], float]
    push: PushServer | None = None
    recorder: Recorder | None = None
    #: Segment tracking (``TENURE_SEGMENTS``); None when off.
    segments: SegmentTracker | None = None
    #: The proxy's turn bookkeeping (its end-of-turn writes in flight).
    turns: TurnBook | None = None

    async def settled(self, tenant: str, session: str) -> None:
        """Wait for ``session``'s answered turn to be recorded (bounded; see TurnBook)."""
        if self.turns is not None:
            await self.turns.settled(tenant, session)


def get_services(request: Request) -> Services:
    services: Services | None = getattr(request.app.state, "services", None)
    if services is None:  # pragma: no cover - only before the lifespan ran
        raise HTTPException(503, "service is starting")
    return services


def tenant_of(
    request: Request, _credentials: Annotated[_Credentials, Depends(_tenant_bearer)]
) -> TenantSpec:
    tenant = get_services(request).tenants.resolve(request.headers.get("authorization"))
    if tenant is None:
        raise ApiError(401, "unknown or missing API key", code="invalid_api_key")
    return tenant


def require_admin(
    request: Request, _credentials: Annotated[_Credentials, Depends(_admin_bearer)]
) -> None:
    """Bearer token check for ``/admin``; open only in explicit dev mode without a token."""
    settings = get_services(request).settings
    expected = settings.admin_token.get_secret_value()
    if not expected and settings.dev_mode:
        return
    token = bearer_token(request.headers.get("authorization"))
    # Bytes on both sides: compare_digest refuses non-ASCII str, and a client may send any
    # byte in a header.
    if token is None or not hmac.compare_digest(token, expected.encode()):
        raise ApiError(
            401,
            "admin bearer token required",
            code="invalid_admin_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
