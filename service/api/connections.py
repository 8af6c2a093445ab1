"""The sidecar's connections, built from its settings: the Redis client (plain, Sentinel or
cluster), the upstream HTTP client (httpx, or the raw/aiohttp clients) and the push channel's
security. The app's lifespan (:mod:`tenure.service.app`) opens and closes them.
"""

from __future__ import annotations

import httpx

from tenure.service.api.upstream.client import AiohttpUpstream, HttpxUpstream, UpstreamClient
from tenure.service.api.upstream.raw import RawUpstream
from tenure.service.push.security import PushSecurity
from tenure.service.settings import Settings
from tenure.service.settings_values import parse_sentinels
from tenure.service.state.topology import RedisClient, RedisTopology, connect

__all__ = ["push_security", "redis_client", "redis_topology", "upstream_client"]


def redis_topology(settings: Settings) -> RedisTopology:
    secret = settings.redis_sentinel_password
    return RedisTopology(
        url=settings.redis_url.get_secret_value(),
        sentinels=parse_sentinels(settings.redis_sentinels),
        master_name=settings.redis_sentinel_master,
        sentinel_password=secret.get_secret_value() if secret is not None else None,
        cluster=settings.redis_cluster,
    )


def redis_client(settings: Settings, socket_timeout_s: float) -> RedisClient:
    # The breaker decides when to try again; a client-side retry would only add waiting.
    return connect(
        redis_topology(settings),
        socket_timeout_s=socket_timeout_s,
        connect_timeout_s=settings.redis_timeout_s,
    )


def upstream_client(
    settings: Settings, transport: httpx.AsyncBaseTransport | None
) -> UpstreamClient:
    if transport is None and settings.upstream_client in ("raw", "aiohttp"):
        kind = RawUpstream if settings.upstream_client == "raw" else AiohttpUpstream
        return kind(
            settings.upstream_url,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            read_timeout_s=settings.upstream_read_timeout_s,
            max_connections=settings.upstream_max_connections,
        )
    return HttpxUpstream(
        httpx.AsyncClient(
            base_url=settings.upstream_url,
            timeout=httpx.Timeout(
                connect=settings.upstream_connect_timeout_s,
                read=settings.upstream_read_timeout_s,
                write=settings.upstream_read_timeout_s,
                pool=settings.upstream_connect_timeout_s,
            ),
            limits=httpx.Limits(
                max_connections=settings.upstream_max_connections,
                max_keepalive_connections=settings.upstream_max_connections,
            ),
            transport=transport,
            trust_env=False,
        )
    )


def push_security(settings: Settings) -> PushSecurity:
    secret = settings.push_curve_secret_key
    return PushSecurity(
        curve_secret_key=secret.get_secret_value() if secret is not None else None,
        client_keys=dict(settings.push_curve_client_keys),
        ipc_mode=settings.push_ipc_mode,
        max_adapters=settings.push_max_adapters,
        engine_ids=frozenset(p.strip() for p in settings.push_engine_ids.split(",") if p.strip()),
    )
