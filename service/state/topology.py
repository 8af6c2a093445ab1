"""Which Redis the sidecar talks to: one server (a URL), a Sentinel-managed master, or a Cluster.

* **URL** (the default): ``redis://host:port/db``, as before.
* **Sentinel**: ``sentinels`` lists ``host:port`` of the Sentinels and ``master_name`` the
  monitored master; redis-py's :class:`~redis.asyncio.sentinel.Sentinel` asks them where the
  master is on every new connection, so after a failover reconnects reach the promoted replica
  (a connection to a demoted master is dropped on its first ``READONLY`` reply). The URL then
  only carries the database number and credentials.
* **Cluster**: the URL names any node; redis-py's
  :class:`~redis.asyncio.cluster.RedisCluster` routes each command by slot. Keys must be
  hash-tagged (:meth:`tenure.service.state.keys.Keys.build`) so every script's keys share a slot.

Durability is Redis's: replication is asynchronous, so a failover can lose what the old master
acknowledged but had not yet sent to the promoted replica (see the README's "Redis failover"
section for the window and what ``WAIT`` buys).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from tenure.service.state.connection import HiredisPackedConnection

__all__ = ["RedisClient", "RedisTopology", "connect"]

#: What the store talks to: one server (plain or Sentinel-managed) or a cluster.
RedisClient = aioredis.Redis | RedisCluster


@dataclass(frozen=True, slots=True)
class RedisTopology:
    url: str = field(repr=False)
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str = "tenure"
    #: Password of the Sentinels themselves (the data nodes' credentials come from the URL).
    sentinel_password: str | None = field(default=None, repr=False)
    cluster: bool = False

    @property
    def mode(self) -> str:
        return "cluster" if self.cluster else "sentinel" if self.sentinels else "url"

    def __repr__(self) -> str:  # never the URL: it may carry a password
        # The host part only, even of a sentinel address that slipped past the settings.
        where = ",".join(f"{h.rpartition('@')[2]}:{p}" for h, p in self.sentinels) or _host_of(
            self.url
        )
        return f"RedisTopology({self.mode}: {where}, master={self.master_name!r})"


def _host_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}" if parts.hostname else parts.scheme


def connect(
    topology: RedisTopology, *, socket_timeout_s: float, connect_timeout_s: float
) -> RedisClient:
    """A client for ``topology``. No client-side retries: the store's breaker decides."""
    common: dict[str, Any] = {
        "socket_timeout": socket_timeout_s,
        "socket_connect_timeout": connect_timeout_s,
    }
    if topology.cluster:
        return RedisCluster.from_url(topology.url, **common, max_connections=512)
    if topology.sentinels:
        parts = urlsplit(topology.url)
        db = int(parts.path.strip("/") or 0) if parts.path.strip("/").isdigit() else 0
        # redis-py 8 types Sentinel's constructor, earlier releases (pyproject allows >= 5) do
        # not: called through Any, mypy strict passes on either without a version-bound ignore.
        sentinel_type: Any = Sentinel
        sentinel = sentinel_type(
            list(topology.sentinels),
            sentinel_kwargs={
                **common,
                **({"password": topology.sentinel_password} if topology.sentinel_password else {}),
            },
        )
        master: aioredis.Redis = sentinel.master_for(
            topology.master_name,
            db=db,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            retry=Retry(NoBackoff(), 0),
            max_connections=512,
            **common,
        )
        return master
    return aioredis.Redis.from_url(
        topology.url,
        # TCP only: a unix:// or rediss:// URL sets its own connection class (the URL wins).
        connection_class=HiredisPackedConnection,
        retry=Retry(NoBackoff(), 0),
        max_connections=512,
        **common,
    )
