"""The sidecar's app factory: ``create_app(settings)`` wires everything in the lifespan.

Nothing is created at import time: Redis clients, the upstream HTTP client, the push server and
the metrics registry belong to one app instance, so tests build as many apps as they like.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from tenure.service.api.connections import push_security, redis_client, upstream_client
from tenure.service.api.errors import api_error, unavailable
from tenure.service.api.proxy.pipeline import TRACKED, Proxy
from tenure.service.api.retention.controller import build_retention
from tenure.service.api.routes import admin, record_admin, retention_admin, sessions
from tenure.service.api.routes.asgi import SidecarApp
from tenure.service.api.routes.deps import Services
from tenure.service.api.routes.openapi import add_proxy_routes
from tenure.service.api.segments.spawns import load_ranker
from tenure.service.api.segments.tracker import SegmentTracker
from tenure.service.api.shapes.base import RouteShape
from tenure.service.api.tenants import TenantResolver
from tenure.service.api.turns.book import TurnBook
from tenure.service.api.turns.recorder import Recorder
from tenure.service.api.turns.runtime import Runtime
from tenure.service.metrics import Metrics
from tenure.service.push.server import PushServer
from tenure.service.settings import Settings
from tenure.service.state.breaker import Breaker, StateUnavailable
from tenure.service.state.keys import Keys
from tenure.service.state.records import StoreLimits
from tenure.service.state.store import StateStore
from tenure.service.state.topology import RedisClient
from tenure.service.wire.push import TierConfig

__all__ = ["create_app"]

log = logging.getLogger(__name__)

#: Sample sessions-by-state every this many refreshes (it reads up to thousands of records).
_STATE_SAMPLE_EVERY = 5


def create_app(
    settings: Settings,
    *,
    registry: CollectorRegistry | None = None,
    clock: Callable[[], float] = time.time,
    upstream_transport: httpx.AsyncBaseTransport | None = None,
    freeze_gc: bool = False,
) -> FastAPI:
    """Build the sidecar app. ``registry`` defaults to a fresh one owned by this app.

    ``freeze_gc`` (``tenure serve``): once started, move every object alive into the
    collector's permanent generation, so full collections under load scan only what requests
    allocate, not the ~10^5 objects of the imported libraries (a tail-latency pause otherwise).
    """
    metrics = Metrics(
        registry if registry is not None else CollectorRegistry(),
        max_adapters=settings.push_max_adapters,
    )
    for warning in settings.startup_warnings():
        log.warning("%s", warning)
    # Loaded now, not in the lifespan: an artefact that does not load stops start-up with
    # one line naming it (SettingsError).
    ranker = load_ranker(settings.worker_ranker) if settings.segments else None

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        keys = Keys.build(settings.redis_prefix, hash_tag=settings.redis_keys_hash_tagged)
        limits = StoreLimits(
            session_ttl_s=settings.session_ttl_s,
            finished_ttl_s=settings.finished_ttl_s,
            decision_stream_maxlen=settings.decision_stream_maxlen,
            list_maxlen=settings.gap_observations_maxlen,
            wait_samples_maxlen=settings.wait_samples_maxlen,
        )

        def count_error(op: str) -> None:
            metrics.redis_errors.labels(op).inc()

        client = redis_client(settings, settings.redis_timeout_s)
        store = StateStore(
            client, keys, Breaker(settings.redis_retry_after_s, on_error=count_error), limits,
            multiplex=settings.redis_multiplex, wait_replicas=settings.redis_wait_replicas,
            wait_timeout_ms=settings.redis_wait_timeout_ms,
            on_short_wait=lambda _acked: metrics.redis_wait_short.inc(),
        )  # fmt: skip
        tenants = TenantResolver(settings.tenants, settings.default_tenant)
        push: PushServer | None = None

        async def retention_changed() -> None:
            # A branch change reaches every adapter at once, not at the next periodic snapshot.
            if push is not None:
                await push.broadcast_snapshot()

        retention = build_retention(settings, store, metrics, clock, retention_changed)
        runtime = Runtime(
            store, metrics, gap_log_len=settings.gap_observations_maxlen,
            tenants=tenants.names, retention=retention, clock=clock,
        )  # fmt: skip
        await runtime.refresh(sample_states=True)
        upstream = upstream_client(settings, upstream_transport)
        tail_client: RedisClient | None = None
        if settings.push_addr:
            # Blocking stream reads need their own connection and a longer socket timeout.
            tail_client = redis_client(settings, settings.redis_timeout_s + 5.0)
            tail_store = StateStore(
                tail_client, keys, Breaker(settings.redis_retry_after_s, on_error=count_error),
                limits,
            )  # fmt: skip

            def tier_config() -> TierConfig:
                config = runtime.config
                return TierConfig(
                    policy_mode=config.policy_mode,
                    host_capacity_bytes=config.host_capacity_bytes.get("cpu"),
                    overdue_slack_s=config.overdue_slack_s,
                    retention=retention.push_state(config),
                )

            push = PushServer(
                settings.push_addr, tail_store, metrics, tier_config=tier_config,
                snapshot_interval_s=settings.push_snapshot_interval_s, clock=clock,
                security=push_security(settings), on_resumes=retention.record_resumes,
            )  # fmt: skip
            await push.start()
        recorder = Recorder(
            # The keys' root (hash-tagged on a cluster: the recorder's script keys share a slot).
            client, keys.prefix, enabled=settings.record_enabled,
            max_bytes=settings.record_max_bytes, chunk_bytes=settings.record_chunk_bytes,
            clock=clock,
        )  # fmt: skip
        segments = (
            SegmentTracker(settings, store, upstream, metrics, ranker, clock=clock)
            if ranker is not None
            else None
        )
        # Built in the lifespan, so on the loop it serves.
        turns = TurnBook(settings, store, runtime, metrics, clock, recorder, segments)
        proxy = Proxy(settings, store, metrics, upstream, tenants, turns, recorder, segments)
        app.state.services = Services(
            settings=settings, store=store, runtime=runtime, metrics=metrics, tenants=tenants,
            clock=clock, push=push, recorder=recorder, segments=segments, turns=turns,
        )  # fmt: skip
        app.state.proxy = proxy

        stopping = asyncio.Event()

        async def refresh_forever() -> None:
            rounds = 0
            # A stop event rather than cancellation alone: a cancel that lands inside a Redis
            # client timeout block can be swallowed, and shutdown must not hang on it.
            while not stopping.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), settings.refresh_interval_s)
                if stopping.is_set():
                    return
                rounds += 1
                try:
                    await runtime.refresh(sample_states=rounds % _STATE_SAMPLE_EVERY == 0)
                except Exception:
                    log.exception("runtime refresh failed")

        refresher = asyncio.get_running_loop().create_task(refresh_forever())
        if freeze_gc:
            gc.collect()
            gc.freeze()
        try:
            yield
        finally:
            stopping.set()
            await asyncio.wait({refresher}, timeout=2.0)
            refresher.cancel()
            await proxy.drain()
            if push is not None:
                await push.stop()
            await upstream.aclose()
            await store.aclose()
            await client.aclose()
            if tail_client is not None:
                await tail_store.aclose()
                await tail_client.aclose()

    def proxy_of(request: Request) -> Proxy:
        proxy: Proxy = request.app.state.proxy
        return proxy

    def tracked(shape: RouteShape) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            return await proxy_of(request).tracked(request, shape)

        return handle

    async def passthrough(request: Request) -> Response:
        return await proxy_of(request).passthrough(request)

    # The route table, once: every tracked API's path to the one pipeline with its shape.
    # POSTs to them never reach the router (SidecarApp.fast_routes, ahead of FastAPI's stack);
    # they are registered too, as plain Starlette routes (the proxy takes the raw request and
    # returns a raw response), for the schema and for other methods (405).
    app = SidecarApp(
        title="Tenure sidecar",
        version="0.1.0",
        lifespan=lifespan,
        description="OpenAI-compatible proxy with KV-cache lifecycle control.",
        fast_routes={shape.path: tracked(shape) for shape in TRACKED},
        api_max_body_bytes=settings.api_max_body_bytes,
    )
    app.state.metrics = metrics

    @app.exception_handler(StateUnavailable)
    async def _state_unavailable(request: Request, exc: StateUnavailable) -> Response:
        return unavailable(exc.retry_after_s)

    # Lifecycle and admin routes answer every error in one shape (tenure.service.api.errors).
    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return api_error(
            exc.status_code, str(exc.detail), code=getattr(exc, "code", None),
            headers=dict(exc.headers) if exc.headers else None,
        )  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        issues = [
            {"loc": [p if isinstance(p, int) else str(p) for p in err.get("loc", ())],
             "msg": str(err.get("msg", "")), "type": str(err.get("type", ""))}
            for err in exc.errors()
        ]  # fmt: skip
        first = issues[0] if issues else {"loc": [], "msg": "invalid request"}
        where = [str(p) for p in first["loc"][1:]] or [str(p) for p in first["loc"]]
        param = ".".join(where) or None
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
        return api_error(422, message, param=param, detail=issues)

    app.include_router(sessions.router)
    app.include_router(admin.router)
    app.include_router(record_admin.router)
    app.include_router(retention_admin.router)

    # Last, so /v1/sessions/... is matched by the lifecycle routes first.
    app.router.add_route(
        "/v1/{path:path}", passthrough, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]
    )

    add_proxy_routes(app)

    @app.get("/metrics", include_in_schema=False)
    async def metrics_endpoint() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["health"])
    async def healthz(request: Request) -> JSONResponse:
        services: Services = request.app.state.services
        redis_ok = True
        try:
            await services.store.ping()
        except StateUnavailable:
            redis_ok = False
        body: dict[str, Any] = {
            "status": "ok" if redis_ok else "degraded",
            "redis": redis_ok,
            "push_adapters": services.push.adapters if services.push is not None else [],
        }
        return JSONResponse(body)

    return app
