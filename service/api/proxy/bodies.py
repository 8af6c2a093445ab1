"""What the proxy reads of a request's bytes and headers before relaying it.

The caller's ``kv_transfer_params.tenure`` is removed from every body it forwards (the key is
the sidecar's alone); only the headers the proxy needs are decoded, the caller's key read from
``Authorization`` or ``x-api-key`` alike; bad bodies are described for the route's own error.
"""

from __future__ import annotations

from typing import Any

import msgspec

from tenure.service.api.hints import dialects
from tenure.service.api.turns.book import Turn
from tenure.service.api.upstream.client import UpstreamResponse
from tenure.service.harness.profiles import HARNESS_HEADERS
from tenure.service.wire.engine_session import engine_session_id

__all__ = [
    "NOT_JSON",
    "BadBody",
    "TooLarge",
    "bad_body_message",
    "bearer",
    "drop_client_tenure",
    "read_all",
    "strip_client_tenure",
    "wanted_headers",
    "with_session_headers",
]

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.Encoder().encode


#: Client-supplied ``kv_transfer_params.tenure`` is searched this deep in passthrough bodies.
_STRIP_DEPTH = 64
#: Stands for a body that is not JSON at all (``None`` is a JSON value).
NOT_JSON: Any = object()
_READ_HEADERS = frozenset(
    {
        b"authorization",
        b"content-length",
        b"x-api-key",
        *(h.encode() for h in dialects.DIALECT_HEADERS),
        *(h.encode() for h in HARNESS_HEADERS),
    }
)


async def read_all(upstream: UpstreamResponse) -> bytes:
    try:
        return await upstream.read()
    finally:
        await upstream.close()


class TooLarge(Exception):
    """The request body is over ``max_body_bytes``."""


class BadBody(Exception):
    def __init__(self, undecodable: bool) -> None:
        super().__init__()
        self.undecodable = undecodable


def bad_body_message(exc: BadBody) -> str:
    return (
        "the request body is not valid UTF-8 JSON, or is nested too deep"
        if exc.undecodable
        else "the request body must be a JSON object"
    )


def drop_client_tenure(payload: dict[str, Any]) -> bool:
    """Remove a client's own ``kv_transfer_params.tenure`` (and the same key smuggled through
    ``vllm_xargs``, which vLLM merges into the same engine-side dict); True if anything went."""
    dropped = False
    kv = payload.get("kv_transfer_params")
    if isinstance(kv, dict) and "tenure" in kv:
        del kv["tenure"]
        dropped = True
    xargs = payload.get("vllm_xargs")
    if isinstance(xargs, dict) and "kv_transfer_params" in xargs:
        del xargs["kv_transfer_params"]
        dropped = True
    return dropped


def strip_client_tenure(body: bytes, content_type: str | None) -> bytes:
    """A passthrough body with every ``kv_transfer_params.tenure`` removed, at any depth (the
    routes behind the catch-all have schemas of their own).

    A body that is not JSON is forwarded as it is only when it does not claim to be JSON
    (a multipart upload); the engine would read a JSON-typed one, so it must be readable here.
    """
    try:
        payload = _decode_json(body)
    except (msgspec.DecodeError, RecursionError):
        media = (content_type or "").split(";", 1)[0].strip().lower()
        if not media or media == "application/json" or media.endswith("+json"):
            raise BadBody(True) from None
        return body
    if not _strip_nested(payload, _STRIP_DEPTH):
        return body
    try:
        return _encode_json(payload)
    except RecursionError:
        raise BadBody(True) from None


def _strip_nested(node: Any, depth: int) -> bool:
    if depth <= 0:
        # Deeper than any engine route reads: refuse rather than forward unchecked.
        raise BadBody(True)
    dropped = False
    if isinstance(node, dict):
        if drop_client_tenure(node):
            dropped = True
        for value in node.values():
            if isinstance(value, dict | list) and _strip_nested(value, depth - 1):
                dropped = True
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, dict | list) and _strip_nested(value, depth - 1):
                dropped = True
    return dropped


def bearer(headers: dict[str, str]) -> str | None:
    """The caller's credentials as an ``Authorization`` value: ``x-api-key`` (the Anthropic
    clients' spelling) stands for ``Bearer <key>`` on every route."""
    authorization = headers.get("authorization")
    if authorization is None and "x-api-key" in headers:
        authorization = f"Bearer {headers['x-api-key']}"
    return authorization


def wanted_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request headers the proxy reads, in one pass (first occurrence wins).

    ASGI servers give lower-case names; one dict lookup per hint beats Starlette's ``Headers``,
    which scans the whole list per lookup and raises a KeyError for every absent one.
    """
    found: dict[str, str] = {}
    for name, value in raw:
        if name.startswith(b"x-tenure-") or name in _READ_HEADERS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


def with_session_headers(
    headers: list[tuple[bytes, bytes]], names: tuple[bytes, ...], turn: Turn | None
) -> list[tuple[bytes, bytes]]:
    """``headers`` without the client's session headers, plus the tracked session's engine id
    (:func:`~tenure.service.wire.engine_session.engine_session_id`: vLLM's own session field)."""
    out = [(name, value) for name, value in headers if name.lower() not in names]
    if turn is not None:
        value = engine_session_id(turn.tenant, turn.session).encode()
        out.extend((name, value) for name in names)
    return out
