"""Dependencies injected into routes: the app's services, the caller's tenant, admin auth.

The services are built by the app factory's lifespan and kept on ``app.state``; nothing here
is created at import time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import HTTPException, Request

from service.api.runtime import Runtime
from service.api.tenants import TenantResolver
from service.metrics import Metrics
from service.push.server import PushServer
from service.settings import Settings, TenantSpec
from service.state.store import StateStore

__all__ = ["Services", "get_services", "require_admin", "tenant_of"]


@dataclass(slots=True)
class Services:
    settings: Settings
    store: StateStore
    runtime: Runtime
    metrics: Metrics
    tenants: TenantResolver
    clock: Callable[[], float]
    push: PushServer | None = None


def get_services(request: Request) -> Services:
    services: Services | None = getattr(request.app.state, "services", None)
    if services is None:  # pragma: no cover - only before the lifespan ran
        raise HTTPException(503, "service is starting")
    return services


def tenant_of(request: Request) -> TenantSpec:
    tenant = get_services(request).tenants.resolve(request.headers.get("authorization"))
    if tenant is None:
        raise HTTPException(401, "unknown or missing API key")
    return tenant


def require_admin(request: Request) -> None:
    """Bearer token check for ``/admin``; open only in explicit dev mode without a token."""
    settings = get_services(request).settings
    expected = settings.admin_token.get_secret_value()
    if not expected and settings.dev_mode:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), expected):
        raise HTTPException(
            401, "admin bearer token required", headers={"WWW-Authenticate": "Bearer"}
        )
