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

The sidecar owns ``kv_transfer_params.tenure`` on every forwarded request: a tracked request
gets the sidecar's own, and every other one (an untracked completion, any passthrough route)
has a client-supplied one removed before it is forwarded, so no caller can name another
tenant's session to the engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from service.api import decisions, dialects
from service.api.errors import openai_error, unavailable
from service.api.hints import HintError, Hints, parse_hints
from service.api.inference import prefix_digests
from service.api.messages import MessagesShape
from service.api.paths import PathRefused, check_passthrough_path
from service.api.recorder import PendingTurn, Recorder
from service.api.responses import ResponsesShape, stored_response_id
from service.api.route_shape import RouteInputError, RouteShape
from service.api.runtime import Runtime
from service.api.segment_tracker import PendingTurn as SegmentTurn
from service.api.segment_tracker import SegmentRefused, SegmentTracker
from service.api.segments import ResponseFacts, StreamFacts, response_facts
from service.api.tenants import TenantResolver
from service.api.turns import TurnForecasts
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
from service.policy import lifecycle, stop_class
from service.settings import Settings, TenantSpec
from service.state import aliases
from service.state.breaker import StateUnavailable
from service.state.keys import scoped_session_id
from service.state.store import StateStore, TurnStart

__all__ = ["Proxy"]

log = logging.getLogger(__name__)

_decode_json = msgspec.json.decode
_encode_json = msgspec.json.Encoder().encode
_FINISH = re.compile(rb'"finish_reason"\s*:\s*"([A-Za-z_]+)"')
_TOOL_NAME = re.compile(rb'"function"\s*:\s*\{\s*"name"\s*:\s*"([^"\\]{1,128})"')
_USAGE = re.compile(rb'"(prompt|completion)_tokens"\s*:\s*([0-9]{1,12})')


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    message: dict[str, Any] | None = None


class _Completion(msgspec.Struct):
    choices: list[_Choice] = []
    usage: dict[str, Any] | None = None


_completion_decoder = msgspec.json.Decoder(_Completion)


class _TooLarge(Exception):
    pass


#: How a forwarded turn ended, for the record: the upstream answered it (``OK``), answered
#: and then the stream was cut (``CUT``: the turn counts, the session is not finished), or
#: never took it (``FAILED``: the turn is taken back).
OK, CUT, FAILED = "ok", "cut", "failed"
#: Client-supplied ``kv_transfer_params.tenure`` is searched this deep in passthrough bodies.
_STRIP_DEPTH = 64


@dataclass(slots=True)
class _Turn:
    """A tracked request: what the end-of-turn decision needs."""

    tenant: str
    session: str
    #: The number forwarded upstream: Redis's count, or this replica's forecast of it.
    turn: int
    hints: Hints
    parent: str | None
    #: Redis's answer; None while an early-forwarded turn's script is still in flight.
    start: TurnStart | None
    counting: asyncio.Task[TurnStart | None] | None = None
    stop_reason: str | None = None
    tool: str | None = None
    #: The route's shape (None: chat and completions, scanned by ``scan`` below).
    shape: RouteShape | None = None
    #: The answer's own id where the API has one (``/v1/responses``), for chaining.
    answer_id: str | None = None
    #: The shape's typed reading of the request (``Prepared.info``).
    info: Any = None
    #: Segment tracking (``TENURE_SEGMENTS``): the turn's bookkeeping and its response's facts.
    segments: SegmentTurn | None = None
    facts: ResponseFacts | None = None
    stream: StreamFacts | None = None
    #: While recording (service.api.recorder): the request side, and the answer's usage.
    record: PendingTurn | None = None
    usage: dict[str, int] | None = None

    def scan(self, chunk: bytes) -> None:
        if self.stream is not None:
            self.stream.feed(chunk)
        if b"finish_reason" in chunk:
            for match in _FINISH.finditer(chunk):
                self.stop_reason = match.group(1).decode()
        if self.tool is None and b'"function"' in chunk:
            found = _TOOL_NAME.search(chunk)
            if found is not None:
                self.tool = found.group(1).decode(errors="replace")
        if self.record is not None and b'"usage"' in chunk:
            self.usage = {k.decode(): int(v) for k, v in _USAGE.findall(chunk)}


def _clean_tool(name: str | None) -> str:
    if not name:
        return ""
    # "|" separates fields of the gap log; control characters never belong in a tool name.
    return "".join("_" if c == "|" or c < " " else c for c in name[:128])


class Proxy:
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
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[Any]] = set()
        self._forecasts = TurnForecasts() if settings.early_forward else None
        self._early = {
            outcome: metrics.early_forwards.labels(outcome)
            for outcome in ("confirmed", "wrong_turn", "state_unavailable")
        }
        self._request_counters: dict[tuple[str, int], Any] = {}
        self._latency = {
            route: metrics.sidecar_latency.labels(route)
            for route in ("chat", "completions", "passthrough", "messages", "responses")
        }
        self._dialect_events: dict[tuple[str, str, str], Any] = {}
        self._answers_pending: dict[tuple[str, str], asyncio.Task[None]] = {}
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
            return self._done("passthrough", _unauthorized(), started)
        try:
            check_passthrough_path(request.scope)
        except PathRefused as exc:
            return self._done("passthrough", exc.response, started)
        answer_id = stored_response_id(request.url.path)
        if answer_id is not None:
            # vLLM serves stored responses to any caller: only the tenant whose request
            # produced one may read or cancel it.
            try:
                owned = await aliases.resolve(self.store, tenant.name, answer_id)
            except StateUnavailable as exc:
                self.metrics.fail_open.inc()
                return self._done("passthrough", unavailable(exc.retry_after_s), started)
            if owned is None:
                response = openai_error(
                    404, f"response {answer_id[:128]!r} not found", code="not_found"
                )
                return self._done("passthrough", response, started)
        try:
            body = await self._read_body(request, request.headers.get("content-length"))
        except _TooLarge:
            return self._done("passthrough", self._too_large(), started)
        except ClientDisconnect:
            return Response(status_code=499)
        if body:
            try:
                body = _strip_client_tenure(body, request.headers.get("content-type"))
            except _BadBody as exc:
                self.metrics.hint_rejections.labels("body").inc()
                return self._done("passthrough", _bad_body(exc), started)
        path = request.url.path
        if request.url.query:
            path = f"{path}?{request.url.query}"
        return await self._forward(
            request, "passthrough", request.method, path, body, None, started
        )

    async def tracked(self, request: Request, shape: RouteShape) -> Response:
        """A tracked route other than chat (``/v1/messages``, ``/v1/responses``): the chat
        path's lifecycle with the route's own session keys, scanners and error format."""
        started = time.perf_counter()
        route = shape.name
        headers = _wanted_headers(request.scope["headers"])
        authorization = headers.get("authorization")
        if authorization is None and "x-api-key" in headers:
            # The Anthropic clients send their key as x-api-key.
            authorization = f"Bearer {headers['x-api-key']}"
        tenant = self.tenants.resolve(authorization)
        if tenant is None:
            return self._done(route, _unauthorized(shape), started)
        try:
            body = await self._read_body(request, headers.get("content-length"))
        except _TooLarge:
            self.metrics.hint_rejections.labels("body").inc()
            message = f"request body is larger than {self.settings.max_body_bytes} bytes"
            response = shape.error(413, message, param="body", code="body_too_large")
            return self._done(route, response, started)
        except ClientDisconnect:
            return Response(status_code=499)
        try:
            payload = _decode_json(body)
        except (msgspec.DecodeError, RecursionError):
            payload = _NOT_JSON
        if not isinstance(payload, dict):
            self.metrics.hint_rejections.labels("body").inc()
            message = _bad_body_message(_BadBody(payload is _NOT_JSON))
            response = shape.error(400, message, param="body", code="invalid_body")
            return self._done(route, response, started)
        turn: _Turn | None = None
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
            hints = self._with_dialects(hints, headers, payload, native)
            if hints.session is None and prepared.new_session is not None:
                hints = dataclasses.replace(hints, session=prepared.new_session)
            _drop_client_tenure(payload)
            digests: list[str] = []
            if hints.session is None and prepared.infer is not None and tenant.infer_sessions:
                digests = prepared.infer()
            turn = await self._start_turn(route, tenant, hints, payload, digests)
            if turn is not None:
                turn.shape = shape
                turn.info = prepared.info
            body = self._rewrite(payload, turn, hints)
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
            self._finish_turn(turn, FAILED)
            self.metrics.hint_rejections.labels("body").inc()
            message = _bad_body_message(_BadBody(True))
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
        pending = self._answers_pending.get((tenant.name, answer_id))
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

    async def drain(self, timeout_s: float = 5.0) -> None:
        """Wait for pending end-of-turn writes (shutdown)."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)

    # --- the tracked path ---------------------------------------------------------------------

    async def _completion(self, request: Request, route: str, path: str) -> Response:
        started = time.perf_counter()
        headers = _wanted_headers(request.scope["headers"])
        tenant = self.tenants.resolve(headers.get("authorization"))
        if tenant is None:
            return self._done(route, _unauthorized(), started)
        try:
            body = await self._read_body(request, headers.get("content-length"))
        except _TooLarge:
            return self._done(route, self._too_large(), started)
        except ClientDisconnect:
            return Response(status_code=499)

        try:
            payload = _decode_json(body)
        except (msgspec.DecodeError, RecursionError):
            payload = _NOT_JSON
        if not isinstance(payload, dict):
            # Forwarding bytes the sidecar cannot read would forward whatever they hold.
            self.metrics.hint_rejections.labels("body").inc()
            return self._done(route, _bad_body(_BadBody(payload is _NOT_JSON)), started)
        had_tenure = "tenure" in payload
        body_hints = payload.pop("tenure", None)
        turn: _Turn | None = None
        try:
            hints = parse_hints(headers, body_hints)
            if not isinstance(payload.get("kv_transfer_params", {}), dict | None):
                # Checked before any state is written: a refused request leaves no trace.
                raise HintError("kv_transfer_params", "kv_transfer_params must be an object")
            if dialects.has_dialect_headers(headers) or any(
                key in payload for key in dialects.DIALECT_BODY_KEYS
            ):
                hints = self._with_dialects(hints, headers, payload, dialects.NOTHING)
            dropped = _drop_client_tenure(payload)  # the key is the sidecar's alone
            pending = await self._admit_segments(route, tenant, hints, payload)
            turn = await self._start_turn(route, tenant, hints, payload)
            if turn is not None and self.recorder is not None:
                turn.record = self.recorder.begin(payload, hints)
            seg_tags = await self._segment_tags(request, turn, pending, payload, hints)
            if turn is not None or had_tenure or dropped:
                body = self._rewrite(payload, turn, hints, seg_tags)
        except SegmentRefused as exc:
            self._finish_turn(turn, FAILED)
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
            self._finish_turn(turn, FAILED)
            self.metrics.hint_rejections.labels("body").inc()
            return self._done(route, _bad_body(_BadBody(True)), started)
        return await self._forward(request, route, "POST", path, body, turn, started)

    async def _start_turn(
        self,
        route: str,
        tenant: TenantSpec,
        hints: Hints,
        payload: Any,
        digests: list[str] | None = None,
    ) -> _Turn | None:
        if digests is not None:
            # A shape's own prefix digests (its message format is not chat's).
            digests = digests if hints.session is None and tenant.infer_sessions else []
        else:
            digests = []
        if hints.session is None and route in ("chat", "completions"):
            messages = payload.get("messages") if isinstance(payload, dict) else None
            if route == "chat" and tenant.infer_sessions and isinstance(messages, list):
                digests = prefix_digests(payload.get("model"), messages)
        if hints.session is None and not digests:
            if hints.any:
                raise HintError(
                    "X-Tenure-Session", "tenure hints need a session id (X-Tenure-Session)"
                )
            return None  # no hints, nothing to infer: plain pass-through
        now = self.clock()
        forecast: int | None = None
        forecasting = (
            hints.session is not None
            and self._forecasts is not None
            and not self.store.breaker.is_open
        )
        if forecasting:
            assert self._forecasts is not None and hints.session is not None
            forecast = self._forecasts.reserve(tenant.name, hints.session)
        counting = self._count_turn(tenant, hints, digests, now, forecasting, forecast)
        if forecast is not None:
            assert hints.session is not None
            # Early forward: the request goes upstream now, the turn's script meanwhile.
            task = self._loop.create_task(counting)
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            return _Turn(tenant.name, hints.session, forecast, hints, hints.parent, None, task)
        start = await counting
        if start is None:
            return None  # an inferred session cannot be named without Redis
        return _Turn(tenant.name, start.session, start.turn, hints, hints.parent, start)

    async def _count_turn(
        self,
        tenant: TenantSpec,
        hints: Hints,
        digests: list[str],
        now: float,
        forecasting: bool,
        forecast: int | None,
    ) -> TurnStart | None:
        """The turn's one Redis call and what follows from its answer; None without Redis.

        Everything here runs after the upstream send for an early-forwarded turn, so the
        decision is made here too, not on the way to the upstream.
        """
        # Published only for a new or resumed session, and never as a last turn: that is decided
        # when the turn ends, and only if the upstream took the request.
        decision = lifecycle.on_request(now, last_turn=False, hinted_gap_s=hints.expected_gap_s)
        message = decisions.as_message(
            decision, tenant=tenant.name, session="", turn=0, parent=None, now=now
        )
        counted: int | None = None
        try:
            start = await self.store.turn_start(
                tenant.name,
                session=hints.session,
                prefix_digests=digests,
                new_session_id=f"auto-{digests[0][:24]}" if digests else "",
                segment=hints.segment,
                parent=hints.parent,
                last_turn=hints.last_turn,
                decision=message,
                now=now,
            )
            counted = start.turn
        except StateUnavailable:
            self.metrics.fail_open.inc()
            if hints.session is None:
                return None
            start = TurnStart(hints.session, 0, "", None, 0, False)
        finally:
            if forecasting:
                assert self._forecasts is not None and hints.session is not None
                right = self._forecasts.settle(tenant.name, hints.session, forecast, counted)
                if forecast is not None:
                    outcome = "state_unavailable" if counted is None else "confirmed"
                    self._early[outcome if right else "wrong_turn"].inc()
        if start.seq:
            decisions.count(self.metrics, decision)
        if start.inferred:
            self.metrics.sessions_inferred.inc()
        observation = start.observation
        if observation is not None:
            self.runtime.observe_gap(
                tenant.name, observation.stop_reason, observation.tool, observation.gap_s,
                observation.expected_s,
            )  # fmt: skip
        return start

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
        turn: _Turn | None,
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
        turn: _Turn | None,
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

    # --- forwarding ------------------------------------------------------------------------

    async def _forward(
        self,
        request: Request,
        route: str,
        method: str,
        path: str,
        body: bytes,
        turn: _Turn | None,
        started: float,
        shape: RouteShape | None = None,
    ) -> Response:
        headers_out = forward_headers(
            request.scope["headers"], self._upstream_auth, drop_client_auth=self._drop_client_auth
        )
        if self._session_headers:
            headers_out = _with_session_headers(headers_out, self._session_headers, turn)
        overhead = time.perf_counter() - started

        async def exchange() -> tuple[UpstreamResponse, bytes | None]:
            # One cancellable unit: the request, and for a non-streamed answer its whole body.
            upstream = await self.upstream.send(method, path, headers_out, body)
            if upstream.header("content-type").startswith("text/event-stream"):
                return upstream, None
            return upstream, await _read_all(upstream)

        try:
            upstream, content = await send_or_disconnect(exchange(), request.receive)
        except ClientGone:
            self.metrics.client_disconnects.inc()
            self._count(route, 499, overhead, time.perf_counter())
            self._finish_turn(turn, FAILED)
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
            self._finish_turn(turn, FAILED)
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
                        _scan_completion(turn, content, encoding)
                    if turn.segments is not None and turn.shape is None and not encoding:
                        turn.facts = response_facts(content)
                self._finish_turn(turn, OK if status < 400 else FAILED)
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
            if status >= 400:
                self._finish_turn(turn, FAILED)
            else:
                self._finish_turn(turn, OK if outcome == STREAM_DONE else CUT)

        self._count(route, status, overhead, resumed)
        return RelayResponse(
            upstream,
            status_code=status,
            headers=headers,
            on_chunk=on_chunk,
            on_complete=on_complete,
            error_event=shape.stream_error if shape is not None else None,
        )

    # --- end of turn -------------------------------------------------------------------------

    def _finish_turn(self, turn: _Turn | None, outcome: str) -> None:
        if turn is None or turn.turn == 0:
            return  # untracked, or forwarded fail-open: there is no record to update
        if turn.segments is not None and outcome == OK and self.segments is not None:
            facts = turn.facts if turn.stream is None else turn.stream.facts()
            seg_task = self.segments.record(turn.segments, facts, last_turn=turn.hints.last_turn)
            self._pending.add(seg_task)
            seg_task.add_done_callback(self._pending.discard)
        task = self._loop.create_task(self._record_turn_end(turn, outcome))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if turn.answer_id is not None and outcome != FAILED:
            # A client may chain to this answer before its record is written: see _chained.
            key = (turn.tenant, turn.answer_id)
            self._answers_pending[key] = task
            task.add_done_callback(lambda _t: self._answers_pending.pop(key, None))

    async def _record_turn_end(self, turn: _Turn, outcome: str) -> None:
        start = turn.start
        if turn.counting is not None:
            # An early-forwarded turn: Redis may still be counting it while the answer is
            # already here; what follows needs its number.
            try:
                start = await turn.counting
            except Exception:  # a bug there: say so here, where the result was awaited
                log.exception("counting an early-forwarded turn failed")
                return
        if start is None or start.turn == 0:
            return  # Redis did not count the turn: there is no record to update
        if outcome == FAILED:
            await self._take_back(turn, start)
            return
        if turn.record is not None and self.recorder is not None:
            # Its own task: recording never delays the turn's decision.
            task = self._loop.create_task(
                self.recorder.finish(
                    turn.record, tenant=turn.tenant, session=start.session, turn=start.turn,
                    stop=turn.stop_reason, usage=turn.usage, cut=outcome == CUT,
                )
            )  # fmt: skip
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
        now = self.clock()
        hints = turn.hints
        decision = lifecycle.on_response(
            now,
            stop_reason=turn.stop_reason,
            # A cut stream is not the declared end of the session.
            last_turn=hints.last_turn and outcome == OK,
            hinted_gap_s=hints.expected_gap_s,
            predictor=self.runtime.predictor(turn.tenant),
            tool=turn.tool,
        )
        message = decisions.as_message(
            decision, tenant=turn.tenant, session=start.session, turn=start.turn,
            parent=turn.parent, now=now,
        )  # fmt: skip
        update = decisions.as_update(
            decision,
            message,
            now=now,
            session_ttl_s=self.settings.session_ttl_s,
            finished_ttl_s=self.settings.finished_ttl_s,
        )
        update.fields["last_end"] = repr(now)
        update.fields["stop_reason"] = turn.stop_reason or ""
        update.fields["tool"] = _clean_tool(turn.tool)
        try:
            status, _seq = await self.store.apply(
                turn.tenant,
                start.session,
                update,
                now=now,
                guard=("turn", str(start.turn)),
            )
        except StateUnavailable:
            return
        except Exception:  # a bug here must not take the event loop's task down silently
            log.exception("recording the end of a turn failed")
            return
        if turn.answer_id is not None:
            await self._remember_answer(turn, start.session)
        if status == 1:
            decisions.count(self.metrics, decision)
            if decision.expected_gap_s is not None:
                self.metrics.gap_predicted.labels(stop_class(turn.stop_reason)).observe(
                    decision.expected_gap_s
                )

    async def _remember_answer(self, turn: _Turn, session: str) -> None:
        """Let a later request chain to this answer (``previous_response_id``)."""
        assert turn.answer_id is not None
        try:
            await aliases.remember(
                self.store, turn.tenant, turn.answer_id, session, self.settings.session_ttl_s
            )
        except StateUnavailable:
            return
        except Exception:
            log.exception("recording an answer's session failed")

    async def _take_back(self, turn: _Turn, start: TurnStart) -> None:
        try:
            status, _seq = await self.store.rollback_turn(
                turn.tenant, start.session, start.turn, now=self.clock()
            )
        except StateUnavailable:
            return
        except Exception:
            log.exception("taking back a failed turn failed")
            return
        self.metrics.failed_turns.labels("yes" if status == 1 else "no").inc()
        if status == 1 and self._forecasts is not None and turn.hints.session is not None:
            # Redis's count went back by one: this replica's forecast must not run ahead.
            self._forecasts.forget(turn.tenant, turn.hints.session)

    # --- helpers -------------------------------------------------------------------------------

    async def _read_body(self, request: Request, declared: str | None) -> bytes:
        # Straight from the ASGI channel: Starlette's stream() adds an async generator per
        # request and the proxy reads each body exactly once.
        limit = self.settings.max_body_bytes
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _TooLarge
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
                raise _TooLarge
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


async def _read_all(upstream: UpstreamResponse) -> bytes:
    try:
        return await upstream.read()
    finally:
        await upstream.close()


def _scan_completion(turn: _Turn, content: bytes, content_encoding: str) -> None:
    if content_encoding:
        return  # compressed: leave the stop reason unknown rather than decompress
    try:
        completion = _completion_decoder.decode(content)
    except msgspec.DecodeError:
        return
    if not completion.choices:
        return
    if completion.usage is not None and turn.record is not None:
        turn.usage = {
            k.removesuffix("_tokens"): v
            for k, v in completion.usage.items()
            if k in ("prompt_tokens", "completion_tokens") and isinstance(v, int)
        }
    choice = completion.choices[0]
    turn.stop_reason = choice.finish_reason
    calls = (choice.message or {}).get("tool_calls")
    if isinstance(calls, list) and calls:
        function = calls[0].get("function") if isinstance(calls[0], dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            turn.tool = function["name"]


class _BadBody(Exception):
    def __init__(self, undecodable: bool) -> None:
        super().__init__()
        self.undecodable = undecodable


_NOT_JSON: Any = object()


def _bad_body_message(exc: _BadBody) -> str:
    return (
        "the request body is not valid UTF-8 JSON, or is nested too deep"
        if exc.undecodable
        else "the request body must be a JSON object"
    )


def _bad_body(exc: _BadBody) -> Response:
    return openai_error(400, _bad_body_message(exc), param="body", code="invalid_body")


def _drop_client_tenure(payload: dict[str, Any]) -> bool:
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


def _strip_client_tenure(body: bytes, content_type: str | None) -> bytes:
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
            raise _BadBody(True) from None
        return body
    if not _strip_nested(payload, _STRIP_DEPTH):
        return body
    try:
        return _encode_json(payload)
    except RecursionError:
        raise _BadBody(True) from None


def _strip_nested(node: Any, depth: int) -> bool:
    if depth <= 0:
        # Deeper than any engine route reads: refuse rather than forward unchecked.
        raise _BadBody(True)
    dropped = False
    if isinstance(node, dict):
        if _drop_client_tenure(node):
            dropped = True
        for value in node.values():
            if isinstance(value, dict | list) and _strip_nested(value, depth - 1):
                dropped = True
    elif isinstance(node, list):
        for value in node:
            if isinstance(value, dict | list) and _strip_nested(value, depth - 1):
                dropped = True
    return dropped


def _with_session_headers(
    headers: list[tuple[bytes, bytes]], names: tuple[bytes, ...], turn: _Turn | None
) -> list[tuple[bytes, bytes]]:
    """``headers`` without the client's router-affinity headers, plus the tracked session's."""
    out = [(name, value) for name, value in headers if name.lower() not in names]
    if turn is not None:
        value = scoped_session_id(turn.tenant, turn.session).encode()
        out.extend((name, value) for name in names)
    return out


def _wanted_headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The request headers the proxy reads, in one pass (first occurrence wins).

    ASGI servers give lower-case names; one dict lookup per hint beats Starlette's ``Headers``,
    which scans the whole list per lookup and raises a KeyError for every absent one.
    """
    found: dict[str, str] = {}
    for name, value in raw:
        if name.startswith(b"x-tenure-") or name in _READ_HEADERS:
            found.setdefault(name.decode("latin-1"), value.decode("latin-1"))
    return found


_READ_HEADERS = frozenset(
    {
        b"authorization",
        b"content-length",
        b"x-api-key",
        *(h.encode() for h in dialects.DIALECT_HEADERS),
    }
)


def _unauthorized(shape: RouteShape | None = None) -> Response:
    if shape is not None:
        return shape.error(401, "unknown or missing API key", code="invalid_api_key")
    return openai_error(
        401, "unknown or missing API key", type_="invalid_request_error", code="invalid_api_key"
    )
