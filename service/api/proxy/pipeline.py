"""The one tracked request path: every tracked API runs through :meth:`Proxy.tracked`.

``/v1/chat/completions``, ``/v1/completions``, ``/v1/messages`` and ``/v1/responses`` are the
same pipeline; what differs per API is its shape (:mod:`tenure.service.api.shapes`: session keys,
stop reason, usage, errors, stream events). Per request, in this order:

1. **tenant**: the caller's key, from ``Authorization`` or ``x-api-key`` alike
   (:func:`~tenure.service.api.proxy.bodies.bearer`); unknown -> 401 in the route's format;
2. **body**: read bounded (``TENURE_MAX_BODY_BYTES``) and decoded; not a JSON object -> 400;
3. **hints**: Tenure's own (``X-Tenure-*``, the body's ``tenure``), the route's own keys
   (``shape.prepare``), a response chain followed within the tenant only, and the dialects;
4. **segments** (``TENURE_SEGMENTS``, routes whose shape tracks them): admitted before the
   turn is counted, so a refusal stores nothing;
5. **turn start**: the turn's one Redis call (:class:`~tenure.service.api.turns.book.TurnBook`),
   early-forwarded for a session this replica has seen; the recording's request side;
6. **forward**: ``kv_transfer_params.tenure`` written, the request sent upstream on **its own
   path and query string**, the answer relayed byte for byte (streamed or whole);
7. **turn end**: after the answer left, the shape's reading of it (stop reason, tool, usage)
   recorded with the turn as guard, the recording's answer side under **the route's own name**;
   an upstream that never took the request (an error status, unreachable, timed out, a client
   gone) takes the turn back, and so does a stream the upstream cut after its status (the
   harness retries it at once: the retry is the same turn); a cut stream never finishes its
   session and is ended with **the route's own error event**. The harness's own fields
   (:mod:`tenure.service.api.hints.harness`) name sub-agents as child sessions and infer the end of
   a one-shot run at its final answer.

**Degraded mode (Redis down), the same on every route.** A turn that needs Redis only to be
counted goes upstream uncounted (fail open: ``kv_transfer_params.tenure.degraded`` is true,
``tenure_fail_open_total`` counts it); a request that cannot be served safely without Redis
(a ``previous_response_id`` whose tenant cannot be checked, a step that reads state and finds
the breaker open) is answered ``503`` with ``code: state_unavailable`` and a ``Retry-After``
header, in the route's own error format. Either way nothing is half-written.

The passthrough (every other ``/v1/...`` route) relays as is, with the caller's own
``kv_transfer_params.tenure`` removed at any depth: no caller names another tenant's session
to the engine, and a stored response is read only by the tenant whose request produced it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tenure.service.api.errors import openai_error, unavailable
from tenure.service.api.hints import dialects
from tenure.service.api.hints.harness import HarnessRules
from tenure.service.api.hints.tenure import HintError, Hints, parse_hints
from tenure.service.api.proxy.bodies import (
    NOT_JSON,
    BadBody,
    TooLarge,
    bad_body_message,
    bearer,
    drop_client_tenure,
    read_all,
    strip_client_tenure,
    wanted_headers,
    with_session_headers,
)
from tenure.service.api.proxy.paths import PathRefused, check_passthrough_path
from tenure.service.api.segments.facts import StreamFacts, response_facts
from tenure.service.api.segments.tracker import PendingTurn as SegmentTurn
from tenure.service.api.segments.tracker import SegmentRefused, SegmentTracker
from tenure.service.api.shapes.base import RouteInputError, RouteShape
from tenure.service.api.shapes.chat import ChatShape
from tenure.service.api.shapes.completions import CompletionsShape
from tenure.service.api.shapes.messages import MessagesShape
from tenure.service.api.shapes.responses import (
    ResponsesShape,
    names_stored_responses,
    stored_response_id,
)
from tenure.service.api.tenants import TenantResolver
from tenure.service.api.turns.book import CUT, FAILED, OK, Turn, TurnBook
from tenure.service.api.turns.recorder import Recorder
from tenure.service.api.upstream.client import UpstreamClient, UpstreamError, UpstreamResponse
from tenure.service.api.upstream.relay import (
    STREAM_DONE,
    STREAM_UPSTREAM_CUT,
    ClientGone,
    ProxiedResponse,
    RelayResponse,
    forward_headers,
    response_headers,
    send_or_disconnect,
    upstream_failure,
)
from tenure.service.metrics import Metrics
from tenure.service.settings import Settings, TenantSpec
from tenure.service.state import aliases
from tenure.service.state.breaker import StateUnavailable
from tenure.service.state.keys import scoped_session_id
from tenure.service.state.store import StateStore
from tenure.service.wire.engine_session import ENGINE_SESSION_HEADER, engine_session_id

__all__ = ["TRACKED", "Handler", "Proxy"]

log = logging.getLogger(__name__)

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.Encoder().encode

Handler = Callable[[Request], Awaitable[Response]]

#: The tracked APIs, each a shape over the one pipeline (the route table is built from these).
TRACKED: tuple[RouteShape, ...] = (
    ChatShape(),
    CompletionsShape(),
    MessagesShape(),
    ResponsesShape(),
)
#: The passthrough routes are the engine's own OpenAI ones: their errors and the end of a cut
#: stream are in the OpenAI format, as chat's are.
_PASSTHROUGH_FORMAT: RouteShape = ChatShape()
_MESSAGES_FORMAT: RouteShape = MessagesShape()


def _error_format(path: str) -> RouteShape:
    """The API whose errors a passthrough path answers in: Anthropic's under ``/v1/messages``
    (``count_tokens`` and the rest of that family), OpenAI's elsewhere."""
    if path == _MESSAGES_FORMAT.path or path.startswith(_MESSAGES_FORMAT.path + "/"):
        return _MESSAGES_FORMAT
    return _PASSTHROUGH_FORMAT


_PASSTHROUGH = "passthrough"
#: Routes whose vLLM request body has a ``session_id`` field (chat, completions, responses in
#: vLLM 0.32 and 0.33; its Anthropic ``/v1/messages`` has none and reads ``X-Session-ID``).
_BODY_SESSION_ROUTES = frozenset({"chat", "completions", "responses"})


class Proxy:
    """Relays every proxied request; counts and records the tracked ones (one per app)."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        metrics: Metrics,
        upstream: UpstreamClient,
        tenants: TenantResolver,
        turns: TurnBook,
        recorder: Recorder | None = None,
        segments: SegmentTracker | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.upstream = upstream
        self.tenants = tenants
        self.turns = turns
        self.recorder = recorder
        self.segments = segments
        key = settings.upstream_api_key
        self._upstream_auth = f"Bearer {key.get_secret_value()}" if key is not None else None
        # With tenants configured the caller's bearer token is one of the sidecar's API keys.
        self._drop_client_auth = not tenants.open
        # Router affinity headers (vllm-router's X-Session-ID, ...): set from the tracked
        # session, and a client's own values dropped, so a router keys on the session the
        # sidecar resolved, never on what a caller claims.
        # X-Session-ID always: it is also vLLM's own session field (its KV events carry it).
        self._session_headers = tuple(
            dict.fromkeys(
                name.lower().encode()
                for name in (ENGINE_SESSION_HEADER, *settings.session_header_names)
            )
        )
        self._request_counters: dict[tuple[str, int], Any] = {}
        self._latency = {
            route: metrics.sidecar_latency.labels(route)
            for route in (*(shape.name for shape in TRACKED), _PASSTHROUGH)
        }
        self._dialect_events: dict[tuple[str, str, str], Any] = {}
        self.harness = HarnessRules(metrics)

    # --- entry points ----------------------------------------------------------------------

    def tracked_routes(self) -> dict[str, Handler]:
        """``path -> handler`` of every tracked API (the app's route table is built from it)."""

        def handler(shape: RouteShape) -> Handler:
            async def handle(request: Request) -> Response:
                return await self.tracked(request, shape)

            return handle

        return {shape.path: handler(shape) for shape in TRACKED}

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for pending end-of-turn writes (shutdown)."""
        await self.turns.drain(timeout_s)

    # --- the tracked pipeline ------------------------------------------------------------------

    async def tracked(self, request: Request, shape: RouteShape) -> Response:
        """One request of a tracked API, through the whole pipeline (see the module's doc)."""
        started = time.perf_counter()
        route = shape.name
        headers = wanted_headers(request.scope["headers"])
        tenant = self.tenants.resolve(bearer(headers))
        if tenant is None:
            response = shape.error(401, "unknown or missing API key", code="invalid_api_key")
            return self._done(route, response, started)
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
            # Forwarding bytes the sidecar cannot read would forward whatever they hold.
            self.metrics.hint_rejections.labels("body").inc()
            message = bad_body_message(BadBody(payload is NOT_JSON))
            response = shape.error(400, message, param="body", code="invalid_body")
            return self._done(route, response, started)
        turn: Turn | None = None
        try:
            had_tenure = "tenure" in payload
            hints = parse_hints(headers, payload.pop("tenure", None))
            if not isinstance(payload.get("kv_transfer_params", {}), dict | None):
                # Checked before any state is written: a refused request leaves no trace.
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
            sidecar_named = hints.session is None and prepared.new_session is not None
            if sidecar_named:
                hints = dataclasses.replace(hints, session=prepared.new_session)
            dropped = drop_client_tenure(payload)  # the key is the sidecar's alone
            # vLLM's own session field is the sidecar's too (read after the dialects, which
            # may take a harness's session from it): never a client's raw value upstream.
            dropped = payload.pop("session_id", None) is not None or dropped
            digests: list[str] = []
            if hints.session is None and prepared.infer is not None and tenant.infer_sessions:
                digests = prepared.infer()
            pending = await self._admit_segments(shape, tenant, hints, payload)
            turn = await self.turns.start(tenant, hints, digests)
            if turn is not None:
                turn.info = prepared.info
                turn.sidecar_named = sidecar_named
                turn.harness = harness
                turn.infer_end = tenant.infer_run_end
                self.turns.child_started(turn)
                if self.recorder is not None:
                    turn.record = self.recorder.begin(payload, hints, route, tenant.name)
            seg_tags = await self._segment_tags(request, turn, pending, payload, hints)
            if turn is not None or had_tenure or dropped:
                body = self._rewrite(payload, turn, hints, seg_tags, route)
        except HintError as exc:
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels(exc.label).inc()
            response = shape.error(400, exc.message, param=exc.param, code="invalid_tenure_hint")
            return self._done(route, response, started)
        except RouteInputError as exc:
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels("body").inc()
            response = shape.error(exc.status, exc.message, param=exc.param, code=exc.code)
            return self._done(route, response, started)
        except SegmentRefused as exc:
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels(exc.param or "segments").inc()
            response = shape.error(exc.status, exc.message, param=exc.param, code=exc.code)
            return self._done(route, response, started)
        except StateUnavailable as exc:
            # A step that cannot be taken safely without Redis (a response chain's tenant
            # check): refused in the route's format, the documented degraded answer.
            self.turns.finish(turn, FAILED)
            self.metrics.fail_open.inc()
            response = shape.error(
                503, "session state is temporarily unavailable; retry later",
                type_="service_unavailable", code="state_unavailable",
            )  # fmt: skip
            response.headers["Retry-After"] = str(max(1, int(exc.retry_after_s + 0.999)))
            return self._done(route, response, started)
        except RecursionError:  # decodable, but too deep to encode again
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels("body").inc()
            message = bad_body_message(BadBody(True))
            response = shape.error(400, message, param="body", code="invalid_body")
            return self._done(route, response, started)
        return await self._forward(request, route, "POST", body, turn, started, shape)

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
        self, shape: RouteShape, tenant: TenantSpec, hints: Hints, payload: dict[str, Any]
    ) -> SegmentTurn | None:
        """Segment tracking's checks, before the turn is counted (a refusal stores nothing)."""
        if self.segments is None or hints.session is None or not shape.tracks_segments:
            return None
        return await self.segments.admit(
            tenant.name, hints.session, hints.parent, payload, shape.chat_messages
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

    def _rewrite(
        self,
        payload: dict[str, Any],
        turn: Turn | None,
        hints: Hints,
        seg_tags: dict[str, Any] | None,
        route: str,
    ) -> bytes:
        """The body as forwarded: ``kv_transfer_params.tenure`` and vLLM's ``session_id`` are
        the sidecar's own."""
        if turn is not None:
            if route in _BODY_SESSION_ROUTES:
                payload["session_id"] = engine_session_id(turn.tenant, turn.session)
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

    # --- the passthrough ---------------------------------------------------------------------

    async def passthrough(self, request: Request) -> Response:
        started = time.perf_counter()
        api = _error_format(request.url.path)
        tenant = self.tenants.resolve(bearer(wanted_headers(request.scope["headers"])))
        if tenant is None:
            response = api.error(401, "unknown or missing API key", code="invalid_api_key")
            return self._done(_PASSTHROUGH, response, started)
        try:
            check_passthrough_path(request.scope)
        except PathRefused as exc:
            return self._done(_PASSTHROUGH, exc.response, started)
        refused = await self._stored_response_refused(request, tenant.name, started)
        if refused is not None:
            return refused
        try:
            body = await self._read_body(request, request.headers.get("content-length"))
        except TooLarge:
            self.metrics.hint_rejections.labels("body").inc()
            response = api.error(
                413,
                f"request body is larger than {self.settings.max_body_bytes} bytes",
                param="body",
                code="body_too_large",
            )
            return self._done(_PASSTHROUGH, response, started)
        except ClientDisconnect:
            return Response(status_code=499)
        if body:
            try:
                body = strip_client_tenure(body, request.headers.get("content-type"))
            except BadBody as exc:
                self.metrics.hint_rejections.labels("body").inc()
                response = api.error(400, bad_body_message(exc), param="body", code="invalid_body")
                return self._done(_PASSTHROUGH, response, started)
        return await self._forward(request, _PASSTHROUGH, request.method, body, None, started, api)

    async def _stored_response_refused(
        self, request: Request, tenant: str, started: float
    ) -> Response | None:
        """A passthrough to a stored response of another tenant: its refusal (None: go on)."""
        path = request.url.path
        answer_id = stored_response_id(path)
        if answer_id is None and path != ResponsesShape.path and names_stored_responses(path):
            response = openai_error(404, "no such stored-response path", code="not_found")
            return self._done(_PASSTHROUGH, response, started)
        if answer_id is not None:
            # vLLM serves stored responses to any caller: only the tenant whose request
            # produced one may read or cancel it.
            try:
                owned = await aliases.resolve(self.store, tenant, answer_id)
            except StateUnavailable as exc:
                self.metrics.fail_open.inc()
                return self._done(_PASSTHROUGH, unavailable(exc.retry_after_s), started)
            if owned is None:
                response = openai_error(
                    404, f"response {answer_id[:128]!r} not found", code="not_found"
                )
                return self._done(_PASSTHROUGH, response, started)
        return None

    # --- forwarding ------------------------------------------------------------------------

    async def _forward(
        self,
        request: Request,
        route: str,
        method: str,
        body: bytes,
        turn: Turn | None,
        started: float,
        shape: RouteShape,
    ) -> Response:
        """Send the request upstream on its own path and query, relay the answer, and end the
        turn (if any) once the answer has left."""
        scope = request.scope
        path = scope["path"]
        query = scope.get("query_string", b"")
        if query:
            path = f"{path}?{query.decode('latin-1')}"
        headers_out = forward_headers(
            scope["headers"], self._upstream_auth, drop_client_auth=self._drop_client_auth
        )
        if self._session_headers:
            headers_out = with_session_headers(headers_out, self._session_headers, turn)
        overhead = time.perf_counter() - started

        async def exchange() -> tuple[UpstreamResponse, bytes | None]:
            # One cancellable unit: the request, and for a non-streamed answer its whole body.
            upstream = await self.upstream.send(method, path, headers_out, body)
            if upstream.header("content-type").startswith("text/event-stream"):
                return upstream, None
            return upstream, await read_all(upstream)

        try:
            upstream, content = await send_or_disconnect(exchange(), request.receive)
        except ClientGone:
            self.metrics.client_disconnects.inc()
            self._count(route, 499, overhead, time.perf_counter())
            self.turns.finish(turn, FAILED)
            return Response(status_code=499)
        except UpstreamError as exc:
            failure = upstream_failure(exc)
            response = shape.error(
                failure.status, failure.message, type_=failure.code, code=failure.code
            )
            self.metrics.upstream_errors.labels(failure.kind).inc()
            self._count(route, response.status_code, overhead, time.perf_counter())
            # The upstream never took the turn: take it back (the session must not stay
            # "active", and a declared last turn must not finish it).
            self.turns.finish(turn, FAILED)
            return response
        resumed = time.perf_counter()
        status = upstream.status
        headers = response_headers(upstream.headers)
        if content is not None:
            # A compressed answer is not decompressed to be read: its stop reason stays unknown.
            encoding = upstream.header("content-encoding") if turn is not None else ""

            def sent() -> None:
                # After the answer left: none of this is the client's wait.
                if turn is not None and status < 400 and not encoding:
                    shape.scan_body(turn, content)
                    if turn.segments is not None:
                        turn.facts = response_facts(content)
                self.turns.finish(turn, OK if status < 400 else FAILED)
                self._count(route, status, overhead, resumed)

            return ProxiedResponse(content, status, headers, on_sent=sent)

        on_chunk: Callable[[bytes], None] | None = None
        if turn is not None and status < 400:
            tracked = turn
            stream = tracked.stream

            def on_chunk(chunk: bytes) -> None:
                if stream is not None:
                    stream.feed(chunk)
                shape.scan_chunk(tracked, chunk)

        def on_complete(outcome: str, error: UpstreamError | None) -> None:
            if outcome == STREAM_UPSTREAM_CUT and error is not None:
                self.metrics.upstream_errors.labels(error.kind).inc()
            elif outcome != STREAM_DONE:
                self.metrics.client_disconnects.inc()
            if status >= 400 or outcome == STREAM_UPSTREAM_CUT:
                # A stream the engine cut is retried by the harness at once (Claude Code and
                # Codex within 0.01-0.25 s): taken back, so the retry is the same turn.
                self.turns.finish(turn, FAILED)
            else:
                # A client that leaves once the answer's end went by (Codex's `exec` closes
                # on `response.completed`, before the engine ends the stream) got the whole
                # answer: under load that race went the client's way and a finished one-shot
                # run was kept as a live session (issue 23).
                whole = outcome == STREAM_DONE or (turn is not None and turn.answered)
                self.turns.finish(turn, OK if whole else CUT)

        self._count(route, status, overhead, resumed)
        return RelayResponse(
            upstream,
            status_code=status,
            headers=headers,
            on_chunk=on_chunk,
            on_complete=on_complete,
            error_event=shape.stream_error,
        )

    # --- helpers -------------------------------------------------------------------------------

    async def _read_body(self, request: Request, declared: str | None) -> bytes:
        # Straight from the ASGI channel: Starlette's stream() adds an async generator per
        # request and the proxy reads each body exactly once.
        limit = self.settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise TooLarge
        receive = request.receive
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise ClientDisconnect
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise TooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _count(self, route: str, status: int, overhead: float, resumed: float) -> None:
        counter = self._request_counters.get((route, status))
        if counter is None:
            label = str(status) if 100 <= status <= 599 else "other"
            counter = self._request_counters[(route, status)] = self.metrics.requests.labels(
                route, label
            )
        counter.inc()
        self._latency[route].observe(overhead + (time.perf_counter() - resumed))

    def _done(self, route: str, response: Response, started: float) -> Response:
        self.metrics.requests.labels(route, str(response.status_code)).inc()
        self._latency[route].observe(time.perf_counter() - started)
        return response
