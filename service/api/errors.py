"""Error bodies: one shape for the lifecycle and admin routes, the OpenAI API's on the proxy.

* Proxied ``/v1`` routes (completions and every passthrough route) answer in the OpenAI API's
  style, ``{"error": {"message", "type", "param", "code"}}``, as the engine behind them does.
* Lifecycle (``/v1/sessions``) and admin routes answer :class:`ErrorResponse`: the same
  ``error`` object, plus ``detail`` as FastAPI clients read it (the message, or for a 422 the
  list of validation problems, each with its ``loc``).
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel, Field
from starlette.responses import Response

__all__ = [
    "ErrorInfo",
    "ErrorResponse",
    "ValidationIssue",
    "api_error",
    "default_code",
    "openai_error",
    "unavailable",
]

_encode = msgspec.json.Encoder().encode

#: Error ``type`` and default ``code`` by status, for the lifecycle and admin routes.
_KINDS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "bad_request"),
    401: ("authentication_error", "unauthorized"),
    403: ("permission_error", "forbidden"),
    404: ("not_found_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("conflict_error", "conflict"),
    413: ("invalid_request_error", "body_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    422: ("invalid_request_error", "invalid_request"),
    429: ("rate_limit_error", "rate_limited"),
    503: ("service_unavailable", "state_unavailable"),
}


class ValidationIssue(BaseModel):
    """One problem of a 422: where (``loc``), what (``msg``) and its kind (``type``)."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every error of a lifecycle or admin route."""

    error: ErrorInfo
    detail: str | list[ValidationIssue] = Field(
        description="the message again, or the validation problems of a 422"
    )


def default_code(status: int) -> tuple[str, str]:
    """``(type, code)`` of a lifecycle/admin error with this status."""
    return _KINDS.get(status, ("server_error" if status >= 500 else "invalid_request_error", ""))


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


def api_error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    detail: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A lifecycle/admin error (:class:`ErrorResponse`)."""
    type_, default = default_code(status)
    body = {
        "error": {"message": message, "type": type_, "param": param, "code": code or default},
        "detail": detail if detail is not None else message,
    }
    return Response(
        _encode(body), status_code=status, media_type="application/json", headers=headers
    )


def unavailable(retry_after_s: float) -> Response:
    """503 while the state store is down; clients retry after the breaker's delay."""
    seconds = max(1, int(retry_after_s + 0.999))
    return api_error(
        503,
        "session state is temporarily unavailable; retry later",
        code="state_unavailable",
        headers={"Retry-After": str(seconds)},
    )
