"""The OpenAI-compatible proxy: hints in, ``kv_transfer_params.tenure`` out, bytes relayed.

Per request: resolve the tenant, read the (bounded) body, validate hints, and for a tracked
session make exactly one Redis call (``turn_start``). For a session this replica has seen, the
request is forwarded while that call runs, carrying the replica's forecast of the turn number
(:mod:`service.api.turns`: "early forward"); otherwise, and with ``early_forward`` off, the call
is answered first. After the answer has been handed to the client, the end of the turn (stop
reason, tool, predicted gap) is recorded off the response path. If Redis is unavailable the
request is still forwarded (fail open, counted).

A turn counts only if the upstream took it: an error answer (a 404 for an unknown model, a 400
for a prompt that is too long, a 5xx), an unreachable or timed-out upstream, or a client that
left before the answer takes the turn back in Redis (``StateStore.rollback_turn``), and such a
request never finishes its session, whatever ``last_turn`` said. A stream cut after a 200 keeps
its turn but does not finish the session either.

The proxy is the relay; what a turn is and how its end is recorded is the turn book's
(:mod:`service.api.turn_book`), and reading bodies and headers is :mod:`service.api.proxy_bodies`.

The sidecar owns ``kv_transfer_params.tenure`` on every forwarded request: a tracked request
gets the sidecar's own, and every other one (an untracked completion, any passthrough route)
has a client-supplied one removed before it is forwarded, so no caller can name another
tenant's session to the engine.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service.api import dialects
from service.api.errors import openai_error
from service.api.harness import HarnessRules
from service.api.hints import HintError, parse_hints
from service.api.messages import MessagesShape
from service.api.paths import PathRefused, check_passthrough_path
from service.api.proxy_bodies import (
    NOT_JSON,
    BadBody,
    TooLarge,
    bad_body,
    drop_client_tenure,
    read_all,
    scan_completion,
    strip_client_tenure,
    unauthorized,
    wanted_headers,
    with_session_headers,
)
from service.api.proxy_shaped import ShapedRoutes
from service.api.recorder import Recorder
from service.api.responses import ResponsesShape
from service.api.route_shape import RouteShape
from service.api.runtime import Runtime
from service.api.segment_facts import response_facts
from service.api.segment_lifecycle import SegmentRefused
from service.api.segment_tracker import SegmentTracker
from service.api.tenants import TenantResolver
from service.api.turn_book import CUT, FAILED, OK, Turn, TurnBook
from service.api.upstream import (
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
from service.api.upstream_client import UpstreamClient, UpstreamError, UpstreamResponse
from service.metrics import Metrics
from service.settings import Settings
from service.state.store import StateStore

__all__ = ["Proxy"]

log = logging.getLogger(__name__)

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.Encoder().encode


class Proxy(ShapedRoutes):
    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        runtime: Runtime,
        metrics: Metrics,
        upstream: UpstreamClient,
        tenants: TenantResolver,
        clock: Callable[[], float],
        recorder: Recorder | None = None,
        segments: SegmentTracker | None = None,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.segments = segments
        self.store = store
        self.runtime = runtime
        self.metrics = metrics
        self.upstream = upstream
        self.tenants = tenants
        self.harness = HarnessRules(metrics)
        self.clock = clock
        key = settings.upstream_api_key
        self._upstream_auth = f"Bearer {key.get_secret_value()}" if key is not None else None
        # With tenants configured the caller's bearer token is one of the sidecar's API keys.
        self._drop_client_auth = not tenants.open
        # Router affinity headers (vllm-router's X-Session-ID, ...): set from the tracked
        # session, and a client's own values dropped, so a router keys on the session the
        # sidecar resolved, never on what a caller claims.
        self._session_headers = tuple(
            name.lower().encode() for name in settings.session_header_names
        )
        # Built in the app's lifespan, so on the loop it serves. (Each get_running_loop() call
        # costs a getpid() system call on Python 3.11, several per request.)
        self.turns = TurnBook(settings, store, runtime, metrics, clock, recorder, segments)
        self._request_counters: dict[tuple[str, int], Any] = {}
        self._latency = {
            route: metrics.sidecar_latency.labels(route)
            for route in ("chat", "completions", "passthrough", "messages", "responses")
        }
        self._dialect_events: dict[tuple[str, str, str], Any] = {}
        self._messages = MessagesShape()
        self._responses = ResponsesShape()

    # --- entry points ----------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        return await self._completion(request, "chat", "/v1/chat/completions")

    async def completions(self, request: Request) -> Response:
        return await self._completion(request, "completions", "/v1/completions")

    async def messages(self, request: Request) -> Response:
        return await self.tracked(request, self._messages)

    async def responses(self, request: Request) -> Response:
        return await self.tracked(request, self._responses)

    async def passthrough(self, request: Request) -> Response:
        started = time.perf_counter()
        authorization = request.headers.get("authorization")
        if authorization is None and "x-api-key" in request.headers:
            authorization = f"Bearer {request.headers['x-api-key']}"  # Anthropic clients
        tenant = self.tenants.resolve(authorization)
        if tenant is None:
            return self._done("passthrough", unauthorized(), started)
        try:
            check_passthrough_path(request.scope)
        except PathRefused as exc:
            return self._done("passthrough", exc.response, started)
        refused = await self._stored_response_refused(request, tenant.name, started)
        if refused is not None:
            return refused
        try:
            body = await self._read_body(request, request.headers.get("content-length"))
        except TooLarge:
            return self._done("passthrough", self._too_large(), started)
        except ClientDisconnect:
            return Response(status_code=499)
        if body:
            try:
                body = strip_client_tenure(body, request.headers.get("content-type"))
            except BadBody as exc:
                self.metrics.hint_rejections.labels("body").inc()
                return self._done("passthrough", bad_body(exc), started)
        path = request.url.path
        if request.url.query:
            path = f"{path}?{request.url.query}"
        return await self._forward(
            request, "passthrough", request.method, path, body, None, started
        )

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for pending end-of-turn writes (shutdown)."""
        await self.turns.drain(timeout_s)

    # --- the tracked path ---------------------------------------------------------------------

    async def _completion(self, request: Request, route: str, path: str) -> Response:
        started = time.perf_counter()
        headers = wanted_headers(request.scope["headers"])
        tenant = self.tenants.resolve(headers.get("authorization"))
        if tenant is None:
            return self._done(route, unauthorized(), started)
        try:
            body = await self._read_body(request, headers.get("content-length"))
        except TooLarge:
            return self._done(route, self._too_large(), started)
        except ClientDisconnect:
            return Response(status_code=499)

        try:
            payload = _decode_json(body)
        except (msgspec.DecodeError, RecursionError):
            payload = NOT_JSON
        if not isinstance(payload, dict):
            # Forwarding bytes the sidecar cannot read would forward whatever they hold.
            self.metrics.hint_rejections.labels("body").inc()
            return self._done(route, bad_body(BadBody(payload is NOT_JSON)), started)
        had_tenure = "tenure" in payload
        body_hints = payload.pop("tenure", None)
        turn: Turn | None = None
        try:
            hints = parse_hints(headers, body_hints)
            if not isinstance(payload.get("kv_transfer_params", {}), dict | None):
                # Checked before any state is written: a refused request leaves no trace.
                raise HintError("kv_transfer_params", "kv_transfer_params must be an object")
            if dialects.has_dialect_headers(headers) or any(
                key in payload for key in dialects.DIALECT_BODY_KEYS
            ):
                hints = self._with_dialects(hints, headers, payload, dialects.NOTHING)
            dropped = drop_client_tenure(payload)  # the key is the sidecar's alone
            pending = await self._admit_segments(route, tenant, hints, payload)
            turn = await self.turns.start(route, tenant, hints, payload)
            if turn is not None and self.recorder is not None:
                turn.record = self.recorder.begin(payload, hints)
            seg_tags = await self._segment_tags(request, turn, pending, payload, hints)
            if turn is not None or had_tenure or dropped:
                body = self._rewrite(payload, turn, hints, seg_tags)
        except SegmentRefused as exc:
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels(exc.param or "segments").inc()
            return self._done(
                route,
                openai_error(exc.status, exc.message, param=exc.param, code=exc.code),
                started,
            )
        except HintError as exc:
            self.metrics.hint_rejections.labels(exc.label).inc()
            return self._done(
                route,
                openai_error(400, exc.message, param=exc.param, code="invalid_tenure_hint"),
                started,
            )
        except RecursionError:  # decodable, but too deep to encode again
            self.turns.finish(turn, FAILED)
            self.metrics.hint_rejections.labels("body").inc()
            return self._done(route, bad_body(BadBody(True)), started)
        return await self._forward(request, route, "POST", path, body, turn, started)

    # --- forwarding ------------------------------------------------------------------------

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
        headers_out = forward_headers(
            request.scope["headers"], self._upstream_auth, drop_client_auth=self._drop_client_auth
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
            response, kind = upstream_failure(exc)
            if shape is not None:
                message = msgspec.json.decode(response.body)["error"]["message"]
                response = shape.error(response.status_code, message, code=kind)
            self.metrics.upstream_errors.labels(kind).inc()
            self._count(route, response.status_code, overhead, time.perf_counter())
            # The upstream never took the turn: take it back (the session must not stay
            # "active", and a declared last turn must not finish it).
            self.turns.finish(turn, FAILED)
            return response
        resumed = time.perf_counter()
        status = upstream.status
        headers = response_headers(upstream.headers)
        if content is not None:
            encoding = upstream.header("content-encoding") if turn is not None else ""

            def sent() -> None:
                # After the answer left: none of this is the client's wait.
                if turn is not None and status < 400 and not encoding:
                    if turn.shape is not None:
                        turn.shape.scan_body(turn, content)
                    else:
                        scan_completion(turn, content, encoding)
                    if turn.segments is not None and turn.shape is None:
                        turn.facts = response_facts(content)
                self.turns.finish(turn, OK if status < 400 else FAILED)
                self._count(route, status, overhead, resumed)

            return ProxiedResponse(content, status, headers, on_sent=sent)

        on_chunk: Callable[[bytes], None] | None = None
        if turn is not None and status < 400:
            on_chunk = (
                turn.scan if turn.shape is None else functools.partial(turn.shape.scan_chunk, turn)
            )

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
                self.turns.finish(turn, OK if outcome == STREAM_DONE else CUT)

        self._count(route, status, overhead, resumed)
        return RelayResponse(
            upstream,
            status_code=status,
            headers=headers,
            on_chunk=on_chunk,
            on_complete=on_complete,
            error_event=shape.stream_error if shape is not None else None,
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

    def _too_large(self) -> Response:
        self.metrics.hint_rejections.labels("body").inc()
        return openai_error(
            413,
            f"request body is larger than {self.settings.max_body_bytes} bytes",
            param="body",
            code="body_too_large",
        )

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
