"""API key -> tenant. Session ids are scoped by tenant everywhere they are stored or sent."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from tenure.service.settings import TenantSpec
from tenure.service.settings_values import tenant_key_digest

__all__ = ["TenantResolver", "bearer_token"]


def bearer_token(authorization: str | None) -> bytes | None:
    """The token of ``Authorization: Bearer <token>`` as the bytes the client sent, or None.

    ASGI servers decode header values as latin-1, so encoding back gives the raw bytes for
    any input (a non-ASCII token compares as bytes, it never raises).
    """
    if not authorization or authorization[:7].lower() != "bearer ":
        return None
    return authorization[7:].strip().encode("latin-1", "replace")


class TenantResolver:
    """Maps a bearer API key to its tenant; without configured tenants everyone is ``default``.

    Keys are kept only as SHA-256 digests (``Settings`` hands them over already hashed), so
    the resolver never holds or prints a secret.
    """

    def __init__(self, tenants: Mapping[str, TenantSpec], default: TenantSpec) -> None:
        self._by_digest = {
            bytes.fromhex(tenant_key_digest(key).removeprefix("sha256:")): spec
            for key, spec in tenants.items()
        }
        self.default = default
        self.open = not self._by_digest

    @property
    def names(self) -> list[str]:
        return sorted({spec.name for spec in self._by_digest.values()} | {self.default.name})

    def resolve(self, authorization: str | None) -> TenantSpec | None:
        """The caller's tenant, or ``None`` when tenants are configured and the key is unknown."""
        if self.open:
            return self.default
        token = bearer_token(authorization)
        if not token:
            return None
        return self._by_digest.get(hashlib.sha256(token).digest())

    def __repr__(self) -> str:
        return f"TenantResolver(tenants={self.names})"
