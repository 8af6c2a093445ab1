"""Sidecar settings from the environment (``TENURE_`` prefix), built by :func:`load_settings`.

Nothing here runs at import time: ``tenure serve`` (or a test) calls :func:`load_settings` and
injects the result into the app factory. Secrets (the admin token, tenant API keys, the upstream
key) are ``SecretStr`` so they never appear in reprs or logs.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "SettingsError", "TenantSpec", "load_settings"]

_TENANT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class SettingsError(ValueError):
    """The environment describes a configuration the sidecar refuses to run with."""


class TenantSpec(BaseModel):
    """One tenant: the name its session ids are scoped by, and its per-tenant switches."""

    name: str
    #: Infer sessions from message-prefix hashes when a request carries no session header.
    infer_sessions: bool = True

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _TENANT_NAME.match(value):
            raise ValueError("tenant names are 1-64 characters of [A-Za-z0-9._-]")
        return value


class Settings(BaseSettings):
    """Everything ``tenure serve`` reads from the environment."""

    model_config = SettingsConfigDict(env_prefix="TENURE_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    #: The OpenAI-compatible engine (vLLM) the proxy forwards to.
    upstream_url: str = "http://127.0.0.1:8001"
    #: Replaces the caller's ``Authorization`` upstream when set (vLLM ``--api-key``).
    upstream_api_key: SecretStr | None = None
    #: HTTP client for the upstream hop: ``raw`` (asyncio + httptools, the fastest),
    #: ``aiohttp`` or ``httpx``.
    upstream_client: Literal["raw", "aiohttp", "httpx"] = "raw"
    upstream_connect_timeout_s: float = Field(default=5.0, gt=0, le=600)
    #: Longest silence allowed between upstream bytes (a long generation streams, so this is
    #: a read timeout, not a whole-request deadline).
    upstream_read_timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    upstream_max_connections: int = Field(default=256, ge=1, le=100_000)
    #: Largest request body accepted (bytes); bigger bodies get 413 and are not forwarded.
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)

    redis_url: SecretStr = SecretStr("redis://127.0.0.1:6379/0")
    #: All keys live under this prefix (several deployments can share one Redis).
    redis_prefix: str = "tenure"
    redis_timeout_s: float = Field(default=0.5, gt=0, le=30)
    #: The proxy's two per-request scripts over one pipelined connection (plain TCP URLs);
    #: false = through redis-py's pool, as every other call.
    redis_multiplex: bool = True
    #: Forward a request of a session this replica has seen before Redis has counted its turn
    #: (the script runs meanwhile; the forwarded turn number is this replica's forecast of
    #: Redis's count, see ``service.api.turns``); false = wait for Redis, then forward.
    early_forward: bool = True
    #: After a Redis failure, skip Redis for this long before trying again (fail fast).
    redis_retry_after_s: float = Field(default=1.0, gt=0, le=300)
    #: Finished sessions stay readable this long, then expire.
    finished_ttl_s: int = Field(default=3600, ge=1)
    #: Idle sessions with no activity expire after this long.
    session_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    decision_stream_maxlen: int = Field(default=10_000, ge=100)
    wait_samples_maxlen: int = Field(default=4096, ge=16)
    gap_observations_maxlen: int = Field(default=2048, ge=16)

    #: Bearer token for ``/admin``; the service refuses to start without one unless
    #: ``dev_mode`` is set explicitly.
    admin_token: SecretStr = SecretStr("")
    dev_mode: bool = False

    #: API key -> tenant, as JSON: ``{"sk-abc": {"name": "acme", "infer_sessions": true}}``.
    #: Empty: every caller is the ``default`` tenant.
    tenants: dict[str, TenantSpec] = Field(default_factory=dict, repr=False)  # keys are secrets
    default_tenant: TenantSpec = TenantSpec(name="default")

    #: Push channel (ZeroMQ ROUTER) address; empty disables the channel.
    push_addr: str = "tcp://127.0.0.1:5557"
    push_snapshot_interval_s: float = Field(default=10.0, gt=0, le=3600)
    #: How often each replica reloads runtime config and the learned gap model from Redis.
    refresh_interval_s: float = Field(default=2.0, gt=0, le=3600)

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

    @field_validator("push_addr")
    @classmethod
    def _push_addr(cls, value: str) -> str:
        if value and not value.startswith(("tcp://", "ipc://", "inproc://")):
            raise ValueError("push_addr must be a tcp://, ipc:// or inproc:// ZeroMQ address")
        return value

    @model_validator(mode="after")
    def _admin_token_required(self) -> Settings:
        if not self.admin_token.get_secret_value() and not self.dev_mode:
            raise ValueError(
                "TENURE_ADMIN_TOKEN is empty; set it, or set TENURE_DEV_MODE=1 for local "
                "development (admin routes are then open)"
            )
        return self


def _location(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] == "tenants":
        parts[1] = "<api-key>"  # the key of the tenants mapping is a secret
    return ".".join(parts) or "settings"


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with explicit ``overrides`` taking precedence.

    Raises :class:`SettingsError` with one readable line per problem.
    """
    from pydantic import ValidationError

    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_location(err['loc'])}: {err['msg']}" for err in exc.errors(include_input=False)
        )
        raise SettingsError(problems) from None
