"""The sidecar's ASGI app: FastAPI with the proxied completion routes dispatched ahead of its
middleware stack, and the body limit of the lifecycle and admin routes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from tenure.service.api.errors import openai_error
from tenure.service.api.routes.deps import ApiError

__all__ = ["SidecarApp"]

log = logging.getLogger(__name__)

_Handler = Callable[[Request], Awaitable[Response]]


class SidecarApp(FastAPI):
    """FastAPI, with the proxied completion routes dispatched ahead of its middleware stack.

    Those two routes carry nearly all the traffic and need nothing the stack adds (no
    dependencies, no exception handlers: the proxy answers every error itself), and the stack's
    four ASGI layers and route matching were ~5% of the sidecar's CPU per request. Every other
    route goes through FastAPI as usual.
    """

    def __init__(
        self, *, fast_routes: dict[str, _Handler], api_max_body_bytes: int, **fastapi: Any
    ) -> None:
        super().__init__(**fastapi)
        #: The tracked routes' POST handlers by path (also registered as ordinary routes,
        #: for the schema and for other methods).
        self.fast_routes = fast_routes
        #: Largest body of a lifecycle or admin request (the proxy has its own, larger limit).
        self.api_max_body_bytes = api_max_body_bytes
        for position, (path, handler) in enumerate(fast_routes.items()):
            self.router.routes.insert(position, Route(path, handler, methods=["POST"]))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_routes.get(scope["path"])
            if handler is None and scope["path"].startswith(_API_PREFIXES):
                receive = _limited(receive, scope, self.api_max_body_bytes)
            elif handler is not None:
                scope["app"] = self
                try:
                    response = await handler(Request(scope, receive, send))
                except Exception:
                    log.exception("the proxy failed on %s", scope["path"])
                    response = openai_error(
                        500, "internal error in the sidecar", type_="server_error"
                    )
                await response(scope, receive, send)
                return
        elif scope["type"] == "http" and scope["path"].startswith(_API_PREFIXES):
            receive = _limited(receive, scope, self.api_max_body_bytes)
        await super().__call__(scope, receive, send)


_API_PREFIXES = ("/v1/sessions", "/admin")


def _limited(receive: Receive, scope: Scope, limit: int) -> Receive:
    """``receive`` that refuses a body over ``limit`` bytes (413) before it is all read."""
    for name, value in scope["headers"]:
        if name == b"content-length" and value.isdigit() and int(value) > limit:
            raise_too_large = True
            break
    else:
        raise_too_large = False
    seen = 0

    async def bounded() -> Message:
        nonlocal seen
        if raise_too_large:
            raise ApiError(413, f"request body is larger than {limit} bytes", code="body_too_large")
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise ApiError(
                    413, f"request body is larger than {limit} bytes", code="body_too_large"
                )
        return message

    return bounded
