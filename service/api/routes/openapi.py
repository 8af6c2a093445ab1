"""The proxied routes in the OpenAPI schema.

The proxy's routes are plain Starlette routes (FastAPI's request handling would be pure
overhead there), so FastAPI does not list them. This adds them by hand: the two completion
routes with their lifecycle hints (``X-Tenure-*`` headers or a ``tenure`` body object) and the
``/v1/{path}`` catch-all, each with the answers the sidecar itself gives (OpenAI-style errors)
and ``default`` for whatever the engine answers.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from tenure.service.api.hints.tenure import MAX_GAP_S

__all__ = ["add_proxy_routes", "proxy_paths"]

_ID = {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$", "maxLength": 128}
_REF_ERROR = {"$ref": "#/components/schemas/OpenAIError"}
#: One server-sent event as relayed (``data: {...}`` lines; ``[DONE]`` ends the stream).
_SSE_EVENT = {
    "type": "object",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}

_SCHEMAS: dict[str, Any] = {
    "OpenAIError": {
        "title": "OpenAIError",
        "description": "An error in the OpenAI API's style (the proxy's own, or the engine's).",
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": ["string", "null"]},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "integer", "null"]},
                },
            }
        },
    },
    "AnthropicError": {
        "title": "AnthropicError",
        "description": "An error in the Anthropic Messages API's style (on /v1/messages).",
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": {"type": "string", "enum": ["error"]},
            "error": {
                "type": "object",
                "required": ["type", "message"],
                "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "TenureHints": {
        "title": "TenureHints",
        "description": "Lifecycle hints in the body (removed before forwarding); the same fields "
        "as the X-Tenure-* headers. Two spellings of one field, or a header and a body field, "
        "must agree.",
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "session": _ID,
            "session_id": _ID,
            "last_turn": {"type": "boolean"},
            "expected_gap_ms": {"type": "number", "minimum": 0, "maximum": MAX_GAP_S * 1000},
            "expected_gap_s": {"type": "number", "minimum": 0, "maximum": MAX_GAP_S},
            "segment": _ID,
            "parent": _ID,
            "reasoning": {"type": "boolean"},
        },
    },
}

_HINT_HEADERS: list[dict[str, Any]] = [
    {"name": "X-Tenure-Session", "in": "header", "schema": _ID,
     "description": "the session this request belongs to (scoped by the caller's tenant)"},
    {"name": "X-Tenure-Last-Turn", "in": "header",
     "schema": {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", "on", "off"]},
     "description": "this is the session's last turn (its KV is reclaimed once answered)"},
    {"name": "X-Tenure-Expected-Gap-Ms", "in": "header",
     "schema": {"type": "string", "pattern": r"^[0-9]{1,10}(\.[0-9]{1,3})?$"},
     "description": "expected idle time before the next turn, milliseconds"},
    {"name": "X-Tenure-Segment", "in": "header", "schema": _ID,
     "description": "the part of the context (lead, reviewer, reasoning, ...)"},
    {"name": "X-Tenure-Parent", "in": "header", "schema": _ID,
     "description": "the session that spawned this one"},
    {"name": "X-Tenure-Reasoning", "in": "header",
     "schema": {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no", "on", "off"]},
     "description": "this turn's response reasons (segment tracking: its generation is a "
     "reasoning segment, kept off the SSD tier)"},
]  # fmt: skip


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _REF_ERROR}}}


def _completion_body(prompt_field: str, prompt_schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["model", prompt_field],
                    "properties": {
                        "model": {"type": "string"},
                        prompt_field: prompt_schema,
                        "stream": {"type": "boolean"},
                        "tenure": {"$ref": "#/components/schemas/TenureHints"},
                        "kv_transfer_params": {
                            "type": "object",
                            "description": "passed to the engine; its `tenure` key is the "
                            "sidecar's and is replaced",
                        },
                    },
                    "additionalProperties": True,
                }
            }
        },
    }


def _proxy_responses() -> dict[str, Any]:
    return {
        "200": {
            "description": "the engine's answer, relayed (JSON, or server-sent events when "
            "streaming)",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": _SSE_EVENT},
            },
        },
        "400": _error("malformed hints or body (nothing forwarded, nothing stored)"),
        "401": _error("unknown or missing API key (with tenants configured)"),
        "413": _error("body larger than TENURE_MAX_BODY_BYTES (not forwarded)"),
        "502": _error("the engine is unreachable"),
        "504": _error("the engine did not answer in time"),
        "default": _error("whatever the engine answered, relayed"),
    }


def _completion_route(summary: str, prompt_field: str, prompt: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "tags": ["proxy"],
            "summary": summary,
            "parameters": _HINT_HEADERS,
            "requestBody": _completion_body(prompt_field, prompt),
            "responses": _proxy_responses(),
            "security": [{}, {"TenantKey": []}],
        }
    }


def _passthrough() -> dict[str, Any]:
    responses = {
        "200": {
            "description": "the engine's answer, relayed",
            "content": {
                "application/json": {"schema": {}},
                "text/event-stream": {"schema": _SSE_EVENT},
            },
        },
        "400": _error("a JSON body the sidecar cannot read (nothing forwarded)"),
        "401": _error("unknown or missing API key (with tenants configured)"),
        "404": _error(
            "a path that would leave /v1, an unknown lifecycle path, or engine administration "
            "(nothing forwarded)"
        ),
        "405": _error("a sidecar route called with another method (nothing forwarded)"),
        "413": _error("body larger than TENURE_MAX_BODY_BYTES (not forwarded)"),
        "502": _error("the engine is unreachable"),
        "504": _error("the engine did not answer in time"),
        "default": _error("whatever the engine answered, relayed"),
    }
    operation = {
        "tags": ["proxy"],
        "parameters": [
            {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}
        ],
        "responses": responses,
        "security": [{}, {"TenantKey": []}],
    }
    item: dict[str, Any] = {}
    for method in ("get", "delete"):
        item[method] = {**operation, "summary": "forwarded to the engine unchanged"}
    for method in ("post", "put", "patch"):
        item[method] = {
            **operation,
            "summary": "forwarded to the engine (a client's kv_transfer_params.tenure removed)",
            "requestBody": {"content": {"application/json": {"schema": {}}}},
        }
    return item


_DIALECT_HEADERS: list[dict[str, Any]] = [
    {"name": "X-Dynamo-Session-ID", "in": "header", "schema": {"type": "string"},
     "description": "NVIDIA Dynamo's session id (see service/api/dialects.py)"},
    {"name": "X-Dynamo-Parent-Session-ID", "in": "header", "schema": {"type": "string"},
     "description": "NVIDIA Dynamo's parent session"},
    {"name": "X-Dynamo-Session-Final", "in": "header", "schema": {"type": "string"},
     "description": "NVIDIA Dynamo: true on the session's last request"},
    {"name": "X-Session-Token", "in": "header", "schema": {"type": "string"},
     "description": "llm-d's session-affinity token (lowest precedence)"},
]  # fmt: skip


def _tracked_route(summary: str, body: dict[str, Any], error_ref: str) -> dict[str, Any]:
    def error(description: str) -> dict[str, Any]:
        return {
            "description": description,
            "content": {"application/json": {"schema": {"$ref": error_ref}}},
        }

    responses = {
        "200": _proxy_responses()["200"],
        "400": error(
            "malformed body, hints or route fields, or a previous_response_id this tenant "
            "never received (nothing forwarded, nothing stored)"
        ),
        "401": error("unknown or missing API key (with tenants configured)"),
        "413": error("body larger than TENURE_MAX_BODY_BYTES (not forwarded)"),
        "502": error("the engine is unreachable"),
        "503": error("a chained request while session state is unavailable (not forwarded)"),
        "504": error("the engine did not answer in time"),
        "default": error("whatever the engine answered, relayed"),
    }
    return {
        "post": {
            "tags": ["proxy"],
            "summary": summary,
            "parameters": _HINT_HEADERS + _DIALECT_HEADERS,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                **body,
                                "stream": {"type": "boolean"},
                                "tenure": {"$ref": "#/components/schemas/TenureHints"},
                            },
                            "additionalProperties": True,
                        }
                    }
                },
            },
            "responses": responses,
            "security": [{}, {"TenantKey": []}],
        }
    }


def _stored_responses() -> dict[str, Any]:
    """The stored-response routes: forwarded only for the tenant whose request produced the
    response, and only in their canonical form (:mod:`tenure.service.api.shapes.responses`)."""
    responses = {
        "200": {
            "description": "the engine's answer, relayed",
            "content": {"application/json": {"schema": {}}},
        },
        "401": _error("unknown or missing API key (with tenants configured)"),
        "404": _error(
            "not a response of this tenant, an id over 256 characters, or a non-canonical "
            "path form (nothing forwarded)"
        ),
        "503": _error("session state (Redis) is unavailable: ownership cannot be checked"),
        "502": _error("the engine is unreachable"),
        "504": _error("the engine did not answer in time"),
        "default": _error("whatever the engine answered, relayed"),
    }
    parameter = {
        "name": "response_id", "in": "path", "required": True,
        "schema": {"type": "string", "minLength": 1, "maxLength": 256},
    }  # fmt: skip

    def operation(summary: str) -> dict[str, Any]:
        return {
            "tags": ["proxy"], "summary": summary, "parameters": [parameter],
            "responses": responses, "security": [{}, {"TenantKey": []}],
        }  # fmt: skip

    return {
        "/v1/responses/{response_id}": {
            "get": operation("a stored response (this tenant's only)"),
            "delete": operation("delete a stored response (this tenant's only)"),
        },
        "/v1/responses/{response_id}/cancel": {
            "post": operation("cancel a background response (this tenant's only)"),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": operation("a stored response's input items (this tenant's only)"),
        },
    }


def proxy_paths() -> dict[str, Any]:
    """Path items of the proxied routes."""
    messages = {"type": "array", "items": {"type": "object"}}
    prompt = {"anyOf": [{"type": "string"}, {"type": "array"}]}
    return {
        "/v1/chat/completions": _completion_route("chat completion, proxied", "messages", messages),
        "/v1/completions": _completion_route("completion, proxied", "prompt", prompt),
        "/v1/messages": _tracked_route(
            "Anthropic Messages, proxied and tracked",
            {"model": {"type": "string"}, "messages": messages, "metadata": {"type": "object"}},
            "#/components/schemas/AnthropicError",
        ),
        "/v1/responses": _tracked_route(
            "OpenAI Responses, proxied and tracked (chained by previous_response_id)",
            {
                "model": {"type": "string"},
                "input": prompt,
                "previous_response_id": {"type": "string"},
                "prompt_cache_key": {"type": "string"},
            },
            "#/components/schemas/OpenAIError",
        ),
        **_stored_responses(),
        "/v1/{path}": _passthrough(),
    }


def add_proxy_routes(app: FastAPI) -> None:
    """Make ``app.openapi()`` list the proxied routes beside FastAPI's own."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
        )
        schema["paths"] = {**proxy_paths(), **schema.get("paths", {})}
        components = schema.setdefault("components", {})
        components.setdefault("schemas", {}).update(_SCHEMAS)
        components.setdefault("securitySchemes", {}).setdefault(
            "TenantKey", {"type": "http", "scheme": "bearer"}
        )
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
