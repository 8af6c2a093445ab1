"""The session id an inference engine sees: vLLM's own ``session_id`` / ``X-Session-ID``.

vLLM (0.32, 0.33) reads a request's session from the body's ``session_id`` field, else the
``X-Session-ID`` header, and attaches it to the request's KV ``BlockStored`` events;
vllm-router's ``consistent_hash`` keys on the same header first. The sidecar sets both to this
id on every tracked request. It is derived (a keyed-by-purpose BLAKE2b of tenant and session),
so two tenants' identical client session ids reach the engine as different ids and no
client-chosen string reaches the engine's events, logs or a router's hash ring.
"""

from __future__ import annotations

import hashlib

__all__ = ["ENGINE_SESSION_HEADER", "engine_session_id"]

#: The header vLLM and vllm-router read the session from.
ENGINE_SESSION_HEADER = "X-Session-ID"
_PERSON = b"tenure-engine-sid"  # domain separation: this hash is for nothing else


def engine_session_id(tenant: str, session: str) -> str:
    """``tnr-`` + 32 hex digits, a function of (tenant, session) only (stable across replicas
    and restarts, so a router keeps a session on one engine)."""
    digest = hashlib.blake2b(
        f"{tenant}\x00{session}".encode(), digest_size=16, person=_PERSON[:16]
    ).hexdigest()
    return f"tnr-{digest}"
