"""What the pipeline needs to know about one tracked API: its shape.

The tracked pipeline (:mod:`tenure.service.api.proxy.pipeline`: tenant, body, hints, one Redis call,
early forward, relay, end of turn, record) is the same for every API; what differs per API is
a shape: where a session key sits in the body, how the message prefix is hashed for
inference, how the stop reason, tool name and usage are found in an answer (whole or
streamed), and the API's own error body and stream-error event. ``/v1/chat/completions``
(:mod:`~tenure.service.api.shapes.chat`), ``/v1/completions``
(:mod:`~tenure.service.api.shapes.completions`), ``/v1/messages``
(:mod:`~tenure.service.api.shapes.messages`) and ``/v1/responses``
(:mod:`~tenure.service.api.shapes.responses`) are the shapes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.responses import Response

from tenure.service.api.errors import openai_error
from tenure.service.api.hints.dialects import NOTHING, Found
from tenure.service.api.upstream.client import UpstreamError

__all__ = [
    "NOTHING",
    "Prepared",
    "RouteInputError",
    "RouteShape",
    "TurnScan",
    "openai_error_shape",
    "usage_fields",
]


def openai_error_shape(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    param: str | None = None,
    code: str | None = None,
) -> Response:
    """An error in the OpenAI API's format (chat, completions, responses)."""
    return openai_error(
        status, message, type_=type_ or "invalid_request_error", param=param, code=code
    )


class RouteInputError(ValueError):
    """A request field of the route's own schema is malformed: 400 (or ``status``) in the
    route's error format, nothing forwarded, nothing stored."""

    def __init__(self, param: str, message: str, *, status: int = 400, code: str = "") -> None:
        super().__init__(message)
        self.param = param
        self.message = message
        self.status = status
        self.code = code or "invalid_request"


@dataclass(slots=True)
class Prepared:
    """What a shape read from one request before anything is stored."""

    #: The route's own session keys (precedence: below Dynamo and the vLLM RFC).
    native: Found = NOTHING
    #: Prefix digests for inference (whole request first), computed only when no key names
    #: the session (hashing the conversation is the costly part); None: no inference.
    infer: Callable[[], list[str]] | None = None
    #: An earlier answer's id this request continues (``previous_response_id``).
    chain: str | None = None
    #: A fresh session id for a request that names none and cannot be inferred.
    new_session: str | None = None
    #: The route's typed reading of the request (e.g. reasoning segments), for consumers.
    info: Any = None


class TurnScan(Protocol):
    """The part of a tracked turn a shape's scanners fill in."""

    tenant: str
    session: str
    stop_reason: str | None
    #: Set by a stream scanner once the answer's end went by (see ``Turn.answered``).
    answered: bool
    tool: str | None
    answer_id: str | None
    #: The answer's usage fields, named as the route names them less ``_tokens`` (read only
    #: while :attr:`recording`).
    usage: dict[str, int] | None

    @property
    def recording(self) -> bool: ...


def usage_fields(usage: object) -> dict[str, int] | None:
    """An answer's ``usage`` object as a recording keeps it (its integer counts, named
    without ``_tokens``); ``None`` if it has none."""
    if not isinstance(usage, dict):
        return None
    return {
        k.removesuffix("_tokens"): v
        for k, v in usage.items()
        if k.endswith("_tokens") and isinstance(v, int) and not isinstance(v, bool)
    }


class RouteShape(Protocol):
    #: The route's name: its metric label (``tenure_requests{route=...}``) and the route a
    #: recorded turn names.
    name: str
    #: The path the sidecar serves it on (the request goes upstream on its own path and query).
    path: str
    #: Whether segment tracking (``TENURE_SEGMENTS``) applies to its turns.
    tracks_segments: bool
    #: Whether its requests carry chat ``messages`` (segment tracking reads their new input).
    chat_messages: bool

    def error(
        self,
        status: int,
        message: str,
        *,
        type_: str | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> Response:
        """An error answer in the route's own format."""
        ...

    def prepare(self, payload: dict[str, Any], headers: Mapping[str, str]) -> Prepared:
        """Read and check the route's own fields; raise :class:`RouteInputError` if bad."""
        ...

    def scan_body(self, turn: TurnScan, content: bytes) -> None:
        """Read the stop reason (and tool, answer id, usage) of a whole answer."""
        ...

    def scan_chunk(self, turn: TurnScan, chunk: bytes) -> None:
        """Read them from one streamed chunk."""
        ...

    def stream_error(self, exc: UpstreamError) -> bytes:
        """The events that end a stream the upstream cut, in the API's own format."""
        ...
