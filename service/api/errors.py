"""Error bodies in the OpenAI API's style: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import msgspec
from starlette.responses import Response

__all__ = ["openai_error", "unavailable"]

_encode = msgspec.json.Encoder().encode


def openai_error(
    status: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return Response(
        _encode(body), status_code=status, media_type="application/json", headers=headers
    )


def unavailable(retry_after_s: float) -> Response:
    """503 while the state store is down; clients retry after the breaker's delay."""
    seconds = max(1, int(retry_after_s + 0.999))
    return openai_error(
        503,
        "session state is temporarily unavailable; retry later",
        type_="service_unavailable",
        code="state_unavailable",
        headers={"Retry-After": str(seconds)},
    )
