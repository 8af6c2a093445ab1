"""The proxy's tracked routes other than chat, and the segment tracking of a tracked turn.

``/v1/messages`` and ``/v1/responses`` run the chat path's lifecycle (tenant, bounded body,
hints, one Redis call, early forward, end of turn) with their route's own session keys,
scanners and error format (a :class:`~service.api.route_shape.RouteShape`), hint dialects merged
in, and a response chain (``previous_response_id``) followed only within the tenant. Segment
tracking (``TENURE_SEGMENTS``) admits a turn before it is counted and tags it after. Part of
:class:`~service.api.proxy.Proxy` (which sets the attributes declared here and relays).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service.api import dialects
from service.api.errors import openai_error, unavailable
from service.api.harness import HarnessRules
from service.api.hints import HintError, Hints, parse_hints
from service.api.proxy_bodies import (
    NOT_JSON,
    BadBody,
    TooLarge,
    bad_body_message,
    drop_client_tenure,
    unauthorized,
    wanted_headers,
)
from service.api.recorder import Recorder
from service.api.responses import stored_response_id
from service.api.route_shape import RouteInputError, RouteShape
from service.api.segment_facts import StreamFacts
from service.api.segment_lifecycle import SegmentRefused
from service.api.segment_tracker import PendingTurn as SegmentTurn
from service.api.segment_tracker import SegmentTracker
from service.api.tenants import TenantResolver
from service.api.turn_book import FAILED, Turn, TurnBook
from service.api.upstream import forward_headers
from service.metrics import Metrics
from service.settings import Settings, TenantSpec
from service.state import aliases
from service.state.breaker import StateUnavailable
from service.state.keys import scoped_session_id
from service.state.store import StateStore

__all__ = ["ShapedRoutes"]

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.Encoder().encode


class ShapedRoutes:
    """The tracked shaped routes, segment tagging and the tenure tags of a forwarded body."""

    settings: Settings
    store: StateStore
    metrics: Metrics
    tenants: TenantResolver
    harness: HarnessRules
    turns: TurnBook
    segments: SegmentTracker | None
    recorder: Recorder | None
    _upstream_auth: str | None
    _drop_client_auth: bool
    _dialect_events: dict[tuple[str, str, str], Any]

    async def _read_body(self, request: Request, declared: str | None) -> bytes:
        raise NotImplementedError  # the proxy's bounded body read

    def _done(self, route: str, response: Response, started: float) -> Response:
        raise NotImplementedError  # the proxy's counted answer

    async def _forward(
        self,
        request: Request,
        route: str,
        method: str,
        path: str,
        body: bytes,
        turn: Turn | None,
        started: float,
        shape: RouteShape | None = None,
    ) -> Response:
        raise NotImplementedError  # the proxy's relay

    async def tracked(self, request: Request, shape: RouteShape) -> Response:
        """A tracked route other than chat (``/v1/messages``, ``/v1/responses``): the chat
        path's lifecycle with the route's own session keys, scanners and error format."""
        started = time.perf_counter()
        route = shape.name
        headers = wanted_headers(request.scope["headers"])
        authorization = headers.get("authorization")
        if authorization is None and "x-api-key" in headers:
            # The Anthropic clients send their key as x-api-key.
            authorization = f"Bearer {headers['x-api-key']}"
        tenant = self.tenants.resolve(authorization)
        if tenant is None:
            return self._done(route, unauthorized(shape), started)
        try:
            body = await self._read_body(request, headers.get("content-length"))
        except TooLarge:
            self.metrics.hint_rejections.labels("body").inc()
            message = f"request body is larger than {self.settings.max_body_bytes} bytes"
            response = shape.error(413, message, param="body", code="body_too_large")
            return self._done(route, response, started)
        except ClientDisconnect:
            return Response(status_code=499)
        try:
            payload = _decode_json(body)
        except (msgspec.DecodeError, RecursionError):
            payload = NOT_JSON
        if not isinstance(payload, dict):
            self.metrics.hint_rejections.labels("body").inc()
            message = bad_body_message(BadBody(payload is NOT_JSON))
            response = shape.error(400, message, param="body", code="invalid_body")
            return self._done(route, response, started)
        turn: Turn | None = None
        try:
            hints = parse_hints(headers, payload.pop("tenure", None))
            if not isinstance(payload.get("kv_transfer_params", {}), dict | None):
                raise HintError("kv_transfer_params", "kv_transfer_params must be an object")
            prepared = shape.prepare(payload, headers)
            native = prepared.native
            if prepared.chain is not None:
                # Checked even when another key names the session: the engine would chain
                # to the stored answer whatever the session is called.
                chained = await self._chained(tenant, prepared.chain)
                native = dataclasses.replace(native, session=native.session or chained)
            own = hints
            hints = self._with_dialects(hints, headers, payload, native)
            hints, harness = self.harness.apply(hints, own, headers, payload)
            if hints.session is None and prepared.new_session is not None:
                hints = dataclasses.replace(hints, session=prepared.new_session)
            drop_client_tenure(payload)
            digests: list[str] = []
            if hints.session is None and prepared.infer is not None and tenant.infer_sessions:
                digests = prepared.infer()
            pending = await self._admit_segments(route, tenant, hints, payload)
            turn = await self.turns.start(route, tenant, hints, payload, digests)
            if turn is not None:
                turn.shape = shape
                turn.info = prepared.info
                turn.harness = harness
                turn.infer_end = tenant.infer_run_end
                self.turns.child_started(turn)
                if self.recorder is not None:
                    turn.record = self.recorder.begin(payload, hints, route, tenant.name)
            seg_tags = await self._segment_tags(request, turn, pending, payload, hints)
            body = self._rewrite(payload, turn, hints, seg_tags)
        except SegmentRefused as exc:
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels(exc.param or "segments").inc()
            response = shape.error(exc.status, exc.message, param=exc.param, code=exc.code)
            return self._done(route, response, started)
        except HintError as exc:
            self.metrics.hint_rejections.labels(exc.label).inc()
            response = shape.error(400, exc.message, param=exc.param, code="invalid_tenure_hint")
            return self._done(route, response, started)
        except RouteInputError as exc:
            self.metrics.hint_rejections.labels("body").inc()
            response = shape.error(exc.status, exc.message, param=exc.param, code=exc.code)
            return self._done(route, response, started)
        except StateUnavailable as exc:
            # Only a chained request gets here: its chain cannot be checked without Redis,
            # and forwarding it unchecked could reach another tenant's stored response.
            self.metrics.fail_open.inc()
            response = shape.error(
                503, "session state is temporarily unavailable; retry later",
                code="state_unavailable",
            )  # fmt: skip
            response.headers["Retry-After"] = str(max(1, int(exc.retry_after_s + 0.999)))
            return self._done(route, response, started)
        except RecursionError:
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels("body").inc()
            message = bad_body_message(BadBody(True))
            response = shape.error(400, message, param="body", code="invalid_body")
            return self._done(route, response, started)
        return await self._forward(request, route, "POST", shape.path, body, turn, started, shape)

    def _with_dialects(
        self,
        hints: Hints,
        headers: dict[str, str],
        payload: dict[str, Any],
        native: dialects.Found,
    ) -> Hints:
        merged, events = dialects.apply(hints, dialects.read(headers, payload, native))
        for event in events:
            counter = self._dialect_events.get(event)
            if counter is None:
                counter = self._dialect_events[event] = self.metrics.dialect_fields.labels(*event)
            counter.inc()
        return merged

    async def _chained(self, tenant: TenantSpec, answer_id: str) -> str:
        """The session of the answer a request continues, within this tenant only."""
        pending = self.turns.answers_pending.get((tenant.name, answer_id))
        if pending is not None:
            await asyncio.wait({pending}, timeout=2.0)
        session = await aliases.resolve(self.store, tenant.name, answer_id)
        if session is None:
            raise RouteInputError(
                "previous_response_id",
                f"previous response {answer_id[:128]!r} not found",
                code="previous_response_not_found",
            )
        return session

    async def _admit_segments(
        self, route: str, tenant: TenantSpec, hints: Hints, payload: dict[str, Any]
    ) -> SegmentTurn | None:
        """Segment tracking's checks, before the turn is counted (a refusal stores nothing)."""
        if self.segments is None or hints.session is None:
            return None
        return await self.segments.admit(
            tenant.name, hints.session, hints.parent, payload, route == "chat"
        )

    async def _segment_tags(
        self,
        request: Request,
        turn: Turn | None,
        pending: SegmentTurn | None,
        payload: dict[str, Any],
        hints: Hints,
    ) -> dict[str, Any] | None:
        if pending is None or turn is None or turn.turn == 0 or self.segments is None:
            return None  # untracked, or forwarded fail-open without a turn number
        headers = forward_headers(
            request.scope["headers"], self._upstream_auth, drop_client_auth=self._drop_client_auth
        )
        tags = await self.segments.tags(pending, turn.turn, payload, headers, hints.reasoning)
        turn.segments = pending
        if payload.get("stream"):
            turn.stream = StreamFacts()
        return tags

    async def _stored_response_refused(
        self, request: Request, tenant: str, started: float
    ) -> Response | None:
        """A passthrough to a stored response of another tenant: its refusal (None: go on)."""
        answer_id = stored_response_id(request.url.path)
        if answer_id is not None:
            # vLLM serves stored responses to any caller: only the tenant whose request
            # produced one may read or cancel it.
            try:
                owned = await aliases.resolve(self.store, tenant, answer_id)
            except StateUnavailable as exc:
                self.metrics.fail_open.inc()
                return self._done("passthrough", unavailable(exc.retry_after_s), started)
            if owned is None:
                response = openai_error(
                    404, f"response {answer_id[:128]!r} not found", code="not_found"
                )
                return self._done("passthrough", response, started)
        return None

    def _rewrite(
        self,
        payload: dict[str, Any],
        turn: Turn | None,
        hints: Hints,
        seg_tags: dict[str, Any] | None = None,
    ) -> bytes:
        if turn is not None:
            kv = payload.get("kv_transfer_params")
            if kv is None:
                kv = {}
            elif not isinstance(kv, dict):
                raise HintError("kv_transfer_params", "kv_transfer_params must be an object")
            tenure: dict[str, Any] = {
                "session_id": scoped_session_id(turn.tenant, turn.session),
                "turn": turn.turn,
                "last_turn": hints.last_turn,
            }
            if hints.segment is not None:
                tenure["segment"] = hints.segment
            if hints.parent is not None:
                tenure["parent"] = scoped_session_id(turn.tenant, hints.parent)
            if hints.expected_gap_s is not None:
                tenure["expected_gap_s"] = hints.expected_gap_s
            if hints.retention_s is not None:
                tenure["retention_s"] = hints.retention_s
            if turn.turn == 0:
                tenure["degraded"] = True  # forwarded without lifecycle state (Redis down)
            if seg_tags is not None:
                tenure.update(seg_tags)
            kv["tenure"] = tenure
            payload["kv_transfer_params"] = kv
        return _encode_json(payload)
