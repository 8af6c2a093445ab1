"""API key -> tenant. Session ids are scoped by tenant everywhere they are stored or sent."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from service.settings import TenantSpec

__all__ = ["TenantResolver"]


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class TenantResolver:
    """Maps a bearer API key to its tenant; without configured tenants everyone is ``default``.

    Keys are kept only as SHA-256 digests, so the resolver never holds or prints a secret.
    """

    def __init__(self, tenants: Mapping[str, TenantSpec], default: TenantSpec) -> None:
        self._by_digest = {_digest(key): spec for key, spec in tenants.items()}
        self.default = default
        self.open = not self._by_digest

    @property
    def names(self) -> list[str]:
        return sorted({spec.name for spec in self._by_digest.values()} | {self.default.name})

    def resolve(self, authorization: str | None) -> TenantSpec | None:
        """The caller's tenant, or ``None`` when tenants are configured and the key is unknown."""
        if self.open:
            return self.default
        if not authorization or not authorization.lower().startswith("bearer "):
            return None
        return self._by_digest.get(_digest(authorization[7:].strip()))

    def __repr__(self) -> str:
        return f"TenantResolver(tenants={self.names})"
