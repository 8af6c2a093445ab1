"""Which paths the ``/v1/{path}`` catch-all may forward to the engine.

The catch-all exists so harnesses can reach the engine's other OpenAI routes (``/v1/models``,
``/v1/embeddings``, ...) through the sidecar. It must never:

* leave ``/v1``: a dot segment (``/v1/../metrics``, also sent as ``%2e%2e``), an encoded
  slash or backslash (``%2f``, ``%5c``), a second level of percent-encoding (``%252e``) or a
  control character would let the engine (or a server in front of it) resolve a path the
  sidecar did not check;
* answer for the sidecar's own routes: a lifecycle path (``/v1/sessions...``) or a completion
  route called with the wrong method gets 405 (or 404 for an unknown lifecycle path) here,
  never a forward;
* reach the engine's own administration under ``/v1`` (loading and unloading LoRA adapters
  changes the engine for every tenant).

Refusals are answered here and nothing is forwarded.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Scope

from tenure.service.api.errors import api_error, openai_error
from tenure.service.api.shapes.messages import anthropic_error

__all__ = ["ENGINE_ADMIN_PATHS", "PathRefused", "check_passthrough_path"]

#: vLLM's administrative routes under ``/v1``: never forwarded for a tenant.
ENGINE_ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})
_LIFECYCLE = "/v1/sessions"
_MESSAGES = "/v1/messages"


class PathRefused(Exception):
    def __init__(self, response: Response) -> None:
        super().__init__(response.status_code)
        self.response = response


def _not_forwarded(message: str) -> PathRefused:
    return PathRefused(openai_error(404, message, code="not_found"))


def _unsafe(path: str, raw: bytes) -> bool:
    lowered = raw.lower()
    if b"%2f" in lowered or b"%5c" in lowered:
        return True
    if "%" in path or "\\" in path or any(c < " " or c == "\x7f" for c in path):
        return True
    return any(segment in (".", "..") for segment in path.split("/"))


def _own_methods(scope: Scope) -> set[str]:
    """Methods the sidecar's own routes take at this path (empty: the path is not theirs)."""
    methods: set[str] = set()
    for route in scope["app"].router.routes:
        if getattr(route, "path", None) == "/v1/{path:path}":
            continue
        match, _child = route.matches(scope)
        if match is Match.PARTIAL:
            methods |= set(getattr(route, "methods", None) or ())
    return methods


def check_passthrough_path(scope: Scope) -> None:
    """Raise :class:`PathRefused` (with its answer) unless the path may be forwarded."""
    path: str = scope["path"]
    if _unsafe(path, scope.get("raw_path") or path.encode("utf-8", "replace")):
        raise _not_forwarded("no such route: the path must stay under /v1 (no dot segments)")
    lifecycle = path == _LIFECYCLE or path.startswith(_LIFECYCLE + "/")
    methods = _own_methods(scope)
    if methods:
        allow = {"Allow": ", ".join(sorted(methods))}
        message = f"{scope['method']} is not allowed here; allowed: {allow['Allow']}"
        if lifecycle:
            raise PathRefused(api_error(405, message, headers=allow))
        if path == _MESSAGES or path.startswith(_MESSAGES + "/"):
            raise PathRefused(anthropic_error(405, message, headers=allow))  # its API's shape
        raise PathRefused(openai_error(405, message, code="method_not_allowed", headers=allow))
    if lifecycle:
        raise PathRefused(api_error(404, f"no lifecycle route {path}"))
    if path in ENGINE_ADMIN_PATHS:
        raise _not_forwarded("engine administration is not served through the sidecar")
