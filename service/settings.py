"""Sidecar settings from the environment (``TENURE_`` prefix), built by :func:`load_settings`.

Nothing here runs at import time: ``tenure serve`` (or a test) calls :func:`load_settings` and
injects the result into the app factory. Secrets (the admin token, tenant API keys, the upstream
key) are ``SecretStr`` so they never appear in reprs or logs.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tenure.service.settings_values import (
    MIN_ADMIN_TOKEN_CHARS,
    TENANT_NAME,
    TOKEN_CHARS,
    Z85_KEY,
    check_redis_url,
    error_location,
    is_loopback_host,
    parse_sentinels,
    tenant_key_digest,
)

__all__ = ["Settings", "SettingsError", "TenantSpec", "load_settings"]


class SettingsError(ValueError):
    """The environment describes a configuration the sidecar refuses to run with."""


class TenantSpec(BaseModel):
    """One tenant: the name its session ids are scoped by, and its per-tenant switches."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    """The tenant's name: its session ids and metrics are scoped by it."""
    infer_sessions: bool = True
    """Infer sessions from message-prefix hashes when a request carries no session header."""
    infer_run_end: bool = True
    """Treat a one-shot harness run's final answer (``claude -p``, ``codex exec``;
    ``tenure.service.harness.profiles``) as the likely end of its session: its KV is evicted first
    among the resident, never reclaimed, so a resumed run still hits what is left."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not TENANT_NAME.match(value):
            raise ValueError("tenant names are 1-64 characters of [A-Za-z0-9._-]")
        return value


class Settings(BaseSettings):
    """Everything ``tenure serve`` reads from the environment, by concern.

    Each field is read from ``TENURE_<FIELD NAME>`` and documented by the docstring under it
    (``Settings.model_fields[name].description``, which the reference is generated from; a
    test fails on a field without one).
    """

    model_config = SettingsConfigDict(
        env_prefix="TENURE_", extra="ignore", frozen=True, use_attribute_docstrings=True
    )

    # --- server: the HTTP server, its connections, the admin API (tenure.service.api.routes.server)
    host: str = "127.0.0.1"
    """Address the HTTP server binds (``tenure serve``)."""
    port: int = Field(default=8000, ge=0, le=65535)
    """Port the HTTP server listens on."""
    http_keepalive_timeout_s: float = Field(default=5.0, gt=0, le=3600)
    """An idle keep-alive connection is closed after this long without a new request."""
    http_header_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """A request's head (request line and headers) must arrive within this long of its first byte,
    or of the connection opening: idle and half-sent connections are closed.
    """
    http_body_timeout_s: float = Field(default=60.0, gt=0, le=86_400)
    """Once the head is in, the whole request body must arrive within this long."""
    http_max_header_bytes: int = Field(default=64 * 1024, ge=1024, le=16 * 1024 * 1024)
    """A request head larger than this is answered 431 and the connection closed."""
    http_max_connections: int = Field(default=4096, ge=8, le=1_000_000)
    """Open client connections at most (also capped by the process's file-descriptor limit). At the
    cap, the longest-idle connections that carry no request are closed first, so idle or half-sent
    connections never lock out a request.
    """
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Largest body of a lifecycle or admin request (bytes); bigger ones get 413."""
    admin_token: SecretStr = SecretStr("")
    """Bearer token for ``/admin``; the service refuses to start without one unless ``dev_mode`` is
    set explicitly.
    """
    dev_mode: bool = False
    """Run without an admin token (local development only: the admin routes are then open)."""

    # --- tenants: API keys and the tenants they select (tenure.service.api.tenants) ---------------
    tenants: dict[str, TenantSpec] = Field(default_factory=dict, repr=False)
    """API key -> tenant, as JSON: ``{"sk-abc": {"name": "acme", "infer_sessions": true}}``. Empty:
    every caller is the ``default`` tenant. Keys are kept only as ``sha256:<hex>`` digests (a key
    may be given in that form too), so no dump or repr holds one. With tenants configured the
    caller's key is never forwarded upstream.
    """
    default_tenant: TenantSpec = TenantSpec(name="default")
    """The tenant of every caller when no ``tenants`` are configured."""

    # --- upstream: the engine the proxy forwards to (tenure.service.api.upstream) -----------------
    upstream_url: str = "http://127.0.0.1:8001"
    """The OpenAI-compatible engine (vLLM) the proxy forwards to."""
    upstream_api_key: SecretStr | None = None
    """Replaces the caller's ``Authorization`` upstream when set (vLLM ``--api-key``)."""
    upstream_client: Literal["raw", "aiohttp", "httpx"] = "raw"
    """HTTP client for the upstream hop: ``raw`` (asyncio + httptools, the fastest), ``aiohttp`` or
    ``httpx``.
    """
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0, le=600)
    """Longest wait to open a connection to the upstream, seconds."""
    upstream_read_timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    """Longest silence allowed between upstream bytes (a long generation streams, so this is a read
    timeout, not a whole-request deadline).
    """
    upstream_max_connections: int = Field(default=256, ge=1, le=100_000)
    """Connections to the upstream kept open at most (the pool size)."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    """Largest request body accepted (bytes); bigger bodies get 413 and are not forwarded."""
    upstream_session_headers: str = ""
    """Headers set on forwarded requests to the session's tenant-scoped id, for a router in front of
    several engines (comma-separated): ``X-Session-ID`` for vllm-router's ``consistent_hash``,
    ``x-session-token`` for llm-d, ``x-dynamo-session-id`` for Dynamo. Empty (the single-engine
    default): none.
    """
    early_forward: bool = True
    """Forward a request of a session this replica has seen before Redis has counted its turn (the
    script runs meanwhile; the forwarded turn number is this replica's forecast of Redis's count,
    see ``tenure.service.api.turns.forecasts``); false = wait for Redis, then forward.
    """

    # --- redis: the state store and its topology (tenure.service.state) ---------------------------
    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    """Redis URL (``redis://``, ``rediss://`` or ``unix://``); with Sentinels only its database and
    credentials are used.
    """
    redis_prefix: str = "tenure"
    """All keys live under this prefix (several deployments can share one Redis)."""
    redis_timeout_s: float = Field(default=0.5, gt=0, le=30)
    """Socket timeout of one Redis call, seconds: a slower answer counts as Redis down (fail open).
    """
    redis_multiplex: bool = True
    """The proxy's two per-request scripts over one pipelined connection (plain TCP URLs); false =
    through redis-py's pool, as every other call.
    """
    redis_retry_after_s: float = Field(default=1.0, gt=0, le=300)
    """After a Redis failure, skip Redis for this long before trying again (fail fast)."""
    redis_sentinels: str = ""
    """Redis Sentinels as ``host:port,host:port``: connect to the master they name
    (``redis_sentinel_master``) and follow failovers; the URL then gives only the database and the
    data nodes' credentials. Empty: connect to the URL's server.
    """
    redis_sentinel_master: str = "tenure"
    """The master name the Sentinels know the Redis by."""
    redis_sentinel_password: SecretStr | None = None
    """Password of the Sentinels themselves (the data nodes' is in the URL)."""
    redis_cluster: bool = False
    """Redis Cluster: the URL names any node; keys are hash-tagged into one slot."""
    redis_hash_tag: bool | None = None
    """Put every key in one hash slot (``{prefix}:...``). On by default with ``redis_cluster``;
    changing it on an existing Redis renames every key: run ``tenure state migrate-keys``.
    """
    redis_wait_replicas: int = Field(default=0, ge=0, le=16)
    """After each hot-path script, ``WAIT`` for this many replicas to acknowledge it (up to
    ``redis_wait_timeout_ms``): no acknowledged turn is lost by a failover, at the cost of one
    replication round trip per request. 0: asynchronous replication (Redis's default).
    """
    redis_wait_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    """How long a ``WAIT`` for ``redis_wait_replicas`` waits at most, milliseconds."""

    # --- sessions: how long records live and how much history is kept -----------------------------
    finished_ttl_s: int = Field(default=3600, ge=1)
    """Finished sessions stay readable this long, then expire."""
    session_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    """Idle sessions with no activity expire after this long."""
    decision_stream_maxlen: int = Field(default=10_000, ge=100)
    """Decisions kept in the Redis decision stream the push server tails (approximate trim)."""
    wait_samples_maxlen: int = Field(default=4096, ge=16)
    """Observed approval waits kept in Redis (the retention calibration samples)."""
    gap_observations_maxlen: int = Field(default=2048, ge=16)
    """Observed idle gaps kept per tenant in Redis (what the gap predictor learns from)."""
    refresh_interval_s: float = Field(default=2.0, gt=0, le=3600)
    """How often each replica reloads runtime config and the learned gap model from Redis."""

    # --- retention: the online host-retention controller (tenure.service.api.retention.controller)
    retention_period_s: float = Field(default=900.0, gt=0, le=86_400)
    """Re-choose each tenant's host branch (retain / ttl) this often, seconds."""
    retention_min_samples: int = Field(default=200, ge=1, le=100_000)
    """Observed approval waits a tenant needs before its branch is first re-chosen."""
    retention_margin: float = Field(default=0.05, ge=0, lt=1)
    """The challenger branch must be cheaper by this fraction to take over (hysteresis)."""
    retention_estimator: str = "changepoint:300"
    """Suspension-rate estimator (``window:S``, ``decay:S``, ``changepoint:S``)."""
    retention_window: int = Field(default=2000, ge=16, le=100_000)
    """Suspensions and resumes kept per tenant in Redis (the controller's window)."""
    retention_lease_s: float = Field(default=30.0, gt=0, le=3600)
    """The replica holding the controller lease re-chooses; the lease lasts this long."""
    retention_rule: Literal["branch", "timer"] = "branch"
    """The re-choice rule. ``branch`` (default): the seed's two branches, retain or the
    break-even timer ``t2``. ``timer`` (opt-in, issue 26): a rent-budget scale of ``t2`` from a
    fine grid (0.5-16 x ``t2``, or retain) by expected cost over bootstrap resamples of the
    waits, the SRE's calibration sample as the prior. Opt-in because on the Claude Code gaps it
    beats the seed's controller at 3 x lambda_crit but loses to it at 2 x (notes, issue 26)."""

    # --- segments: segment tracking and the worker ranker (tenure.service.api.segments) -----------
    segments: bool = False
    """Segment tracking for lifetime-aware KV placement (the engine's ``tenure-fs`` tier): every
    tracked request of a named session carries its role, parent, the worker ranker's prediction and
    its segments in ``kv_transfer_params.tenure`` (``tenure.service.api.segments.split``). Costs one
    Redis read per turn (and a ``/tokenize`` call for turns with reasoning).
    """
    segment_tokenize: bool = False
    """Declare a reasoning turn's generation a reasoning segment before it is generated, its start
    counted with the engine's ``/tokenize`` (exact; one extra upstream round trip). Only useful when
    the engine offloads generated blocks (``offload_prompt_only: false``; vLLM 0.32 offloads prompt
    blocks only by default, so carried reasoning, which comes back inside a prompt, is what reaches
    its tiers and is split either way).
    """
    worker_ranker: str = ""
    """A ``tenure train-ranker`` artefact for the worker ranker; empty = the type heuristic."""

    # --- push: the push channel to the engine adapters (tenure.service.push) ----------------------
    push_addr: str = "tcp://127.0.0.1:5557"
    """Push channel (ZeroMQ ROUTER) address; empty disables the channel."""
    push_snapshot_interval_s: float = Field(default=10.0, gt=0, le=3600)
    """How often the push server sends every adapter a full snapshot, seconds."""
    push_curve_secret_key: SecretStr | None = None
    """CURVE secret key of the sidecar (Z85, 40 characters; ``zmq.curve_keypair()``): the channel is
    encrypted and adapters authenticate the sidecar by its public key.
    """
    push_curve_client_keys: dict[str, str] = Field(default_factory=dict)
    """Adapters allowed to connect, as JSON ``{"engine-0": "<Z85 public key>"}`` (needs
    ``push_curve_secret_key``). The name is the adapter's label in metrics; empty = any adapter that
    knows the sidecar's public key may connect.
    """
    push_ipc_mode: int = Field(default=0o600, ge=0, le=0o777)
    """Permissions of an ``ipc://`` socket file (octal, e.g. ``600`` or ``660``): who may connect is
    who may open the file.
    """
    push_insecure: bool = False
    """Allow a non-loopback ``tcp://`` push address without CURVE (a trusted private network only:
    every peer that can connect reads all tenants' decisions).
    """
    push_engine_ids: str = ""
    """Engine ids adapters may report under (``TENURE_ENGINE_ID`` / ``tenure_engine_id`` on each
    engine), comma-separated: their labels in per-engine metrics and ``/admin/engines``; any other
    id is ``other``. Empty: the first ids heard, bounded.
    """
    push_max_adapters: int = Field(default=64, ge=1, le=10_000)
    """Adapters tracked at once (peers beyond it are ignored until one goes silent)."""

    # --- recording: the traffic recording, off by default (tenure.service.api.turns.recorder) -----
    record_enabled: bool = False
    """Record the proxied traffic (no text: hashes, token counts, stop reasons, hints) from start-
    up; ``PUT /admin/record`` switches it at run time.
    """
    record_max_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, le=16 * 1024**3)
    """The recording's size bound in Redis (bytes); turns beyond it are dropped and counted."""
    record_chunk_bytes: int = Field(default=256, ge=16, le=1024 * 1024)
    """Request bytes per prefix hash (the granularity of the recorded prefix structure)."""

    @field_validator("retention_estimator")
    @classmethod
    def _known_estimator(cls, value: str) -> str:
        from tenure.service.policy.rate import rate_estimator

        rate_estimator(value)  # raises with the valid kinds named
        return value

    @field_validator("upstream_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("upstream_url must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("redis_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z0-9._-]{1,32}$", value):
            raise ValueError("redis_prefix must be 1-32 characters of [A-Za-z0-9._-]")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: SecretStr) -> SecretStr:
        check_redis_url(value.get_secret_value())
        return value

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, value: str) -> str:
        parse_sentinels(value)
        return value

    @field_validator("upstream_session_headers")
    @classmethod
    def _header_names(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            if name and not re.match(r"^[A-Za-z0-9-]{1,64}$", name):
                raise ValueError(f"header name {name!r} must be 1-64 characters of [A-Za-z0-9-]")
        return value

    @model_validator(mode="after")
    def _redis_topology(self) -> Settings:
        if self.redis_cluster and self.redis_sentinels:
            raise ValueError("redis_cluster and redis_sentinels exclude each other")
        if self.redis_cluster and self.redis_hash_tag is False:
            raise ValueError("redis_cluster needs hash-tagged keys (redis_hash_tag)")
        if self.redis_wait_replicas and (self.redis_cluster or not self.redis_multiplex):
            raise ValueError(
                "redis_wait_replicas works on the multiplexed hot path (plain URL or Sentinel, "
                "redis_multiplex on)"
            )
        return self

    @property
    def redis_keys_hash_tagged(self) -> bool:
        return self.redis_cluster if self.redis_hash_tag is None else self.redis_hash_tag

    @property
    def session_header_names(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.upstream_session_headers.split(",") if p.strip())

    @field_validator("push_addr")
    @classmethod
    def _push_addr(cls, value: str) -> str:
        if value and not value.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("push_addr must be a tcp://, ipc:// or inproc:// ZeroMQ address")
        return value

    @field_validator("admin_token")
    @classmethod
    def _strong_token(cls, value: SecretStr) -> SecretStr:
        token = value.get_secret_value()
        if token and (len(token) < MIN_ADMIN_TOKEN_CHARS or not TOKEN_CHARS.match(token)):
            raise ValueError(
                f"TENURE_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} visible ASCII "
                "characters without spaces (e.g. openssl rand -hex 32)"
            )
        return value

    @field_validator("tenants")
    @classmethod
    def _hash_keys(cls, value: dict[str, TenantSpec]) -> dict[str, TenantSpec]:
        hashed: dict[str, TenantSpec] = {}
        for key, spec in value.items():
            if not key or not TOKEN_CHARS.match(key):
                raise ValueError("tenant API keys must be visible ASCII without spaces")
            hashed[tenant_key_digest(key)] = spec
        return hashed

    @field_validator("push_ipc_mode", mode="before")
    @classmethod
    def _octal(cls, value: object) -> object:
        # The environment gives text: read it as the octal a chmod takes.
        if isinstance(value, str):
            try:
                return int(value, 8)
            except ValueError:
                raise ValueError("push_ipc_mode must be octal permissions, e.g. 600") from None
        return value

    @field_validator("push_curve_secret_key")
    @classmethod
    def _z85_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not Z85_KEY.match(value.get_secret_value()):
            raise ValueError("push_curve_secret_key must be a 40-character Z85 CURVE key")
        return value

    @field_validator("push_curve_client_keys")
    @classmethod
    def _z85_clients(cls, value: dict[str, str]) -> dict[str, str]:
        for name, key in value.items():
            if not TENANT_NAME.match(name):
                raise ValueError("adapter names are 1-64 characters of [A-Za-z0-9._-]")
            if not Z85_KEY.match(key):
                raise ValueError(f"the key of adapter {name!r} is not a 40-character Z85 key")
        return value

    @model_validator(mode="after")
    def _admin_token_required(self) -> Settings:
        if not self.admin_token.get_secret_value() and not self.dev_mode:
            raise ValueError(
                "TENURE_ADMIN_TOKEN is empty; set it, or set TENURE_DEV_MODE=1 for local "
                "development (admin routes are then open)"
            )
        return self

    @model_validator(mode="after")
    def _push_secured(self) -> Settings:
        if self.push_curve_client_keys and self.push_curve_secret_key is None:
            raise ValueError("push_curve_client_keys needs push_curve_secret_key")
        if (
            self.push_addr.startswith("tcp://")
            and self.push_curve_secret_key is None
            and not self.push_insecure
            and not is_loopback_host(urlsplit(self.push_addr).hostname or "")
        ):
            raise ValueError(
                f"push_addr {self.push_addr} is reachable from the network but the channel is "
                "not authenticated: set TENURE_PUSH_CURVE_SECRET_KEY (CURVE), use ipc:// or a "
                "loopback address, or set TENURE_PUSH_INSECURE=1 on a trusted network"
            )
        return self

    def startup_warnings(self) -> list[str]:
        """What an operator must hear about at start-up (printed by ``tenure serve``)."""
        warnings: list[str] = []
        if not self.admin_token.get_secret_value() and not is_loopback_host(self.host):
            warnings.append(
                f"dev mode on {self.host}: the admin API is open to everyone who can reach "
                "this address; set TENURE_ADMIN_TOKEN or bind 127.0.0.1"
            )
        if self.push_addr.startswith("tcp://") and self.push_curve_secret_key is None:
            where = urlsplit(self.push_addr).hostname or ""
            if not is_loopback_host(where):
                warnings.append(
                    f"push channel {self.push_addr} without CURVE (TENURE_PUSH_INSECURE=1): "
                    "any peer on the network reads every tenant's decisions"
                )
        if self.push_curve_secret_key is not None and not self.push_curve_client_keys:
            warnings.append(
                "push channel: CURVE without TENURE_PUSH_CURVE_CLIENT_KEYS accepts any "
                "adapter that knows the sidecar's public key"
            )
        return warnings


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with explicit ``overrides`` taking precedence.

    Raises :class:`SettingsError` with one readable line per problem.
    """
    from pydantic import ValidationError
    from pydantic_settings import SettingsError as SourceError

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{error_location(err['loc'])}: {err['msg']}" for err in exc.errors(include_input=False)
        )
        raise SettingsError(problems) from None
    except SourceError as exc:
        # A variable that is not valid JSON (TENURE_TENANTS='{...'): name it, never echo its
        # value (it holds API keys).
        found = re.search(r'field "([a-z_]+)"', str(exc))
        name = f"TENURE_{found.group(1).upper()}" if found else "a TENURE_ variable"
        raise SettingsError(f"{name} is not valid JSON") from None
