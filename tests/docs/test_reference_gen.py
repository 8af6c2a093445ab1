"""The reference generator walks settings as they may be split by concern, and renders pages.

The live settings are one flat model today; these synthetic models are the two ways
pydantic-settings nests them (a ``BaseSettings`` group with its own ``env_prefix``, and a plain
model under the parent's ``env_nested_delimiter``), so the reference keeps listing every
variable when the settings are split.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "hooks"))

import gen_reference


class RedisGroup(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_REDIS_")

    #: Where Redis is.
    url: SecretStr = SecretStr("redis://localhost:6379/0")
    timeout_s: float = Field(default=0.5, gt=0, le=30)


class Limits(BaseModel):
    #: Largest body.
    max_body_bytes: int = 32 * 1024 * 1024


class Tenant(BaseModel):
    name: str = "default"


class DemoSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DEMO_", env_nested_delimiter="__")

    #: The engine.
    upstream_url: str = "http://127.0.0.1:8001"
    redis: RedisGroup = Field(default_factory=RedisGroup)
    limits: Limits = Field(default_factory=Limits)
    mode: str | None = None


class FlatSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLAT_")

    default_tenant: Tenant = Tenant()
    port: int = Field(default=8000, description="The port.")


def test_nested_settings_are_walked() -> None:
    rows = {r.env: r for r in gen_reference.setting_rows(DemoSettings)}
    assert set(rows) == {
        "DEMO_UPSTREAM_URL",
        "DEMO_REDIS_URL",
        "DEMO_REDIS_TIMEOUT_S",
        "DEMO_LIMITS__MAX_BODY_BYTES",
        "DEMO_MODE",
    }
    assert rows["DEMO_REDIS_URL"].doc == "Where Redis is."
    assert rows["DEMO_REDIS_URL"].type == "secret"
    assert rows["DEMO_REDIS_URL"].group == "redis"
    assert rows["DEMO_REDIS_TIMEOUT_S"].type == "float (> 0, <= 30)"
    assert rows["DEMO_LIMITS__MAX_BODY_BYTES"].default == "33554432 (`32 * 1024 * 1024`)"
    assert rows["DEMO_MODE"].type == "str | None"


def test_a_model_without_a_delimiter_is_one_json_variable() -> None:
    rows = {r.env: r for r in gen_reference.setting_rows(FlatSettings)}
    assert set(rows) == {"FLAT_DEFAULT_TENANT", "FLAT_PORT"}
    assert rows["FLAT_DEFAULT_TENANT"].type.startswith("JSON")
    assert rows["FLAT_PORT"].doc == "The port."


def test_settings_page_groups_nested_settings() -> None:
    page = gen_reference.settings_markdown(DemoSettings, runtime=False)
    assert "## redis" in page and "## limits" in page
    assert "`DEMO_REDIS_TIMEOUT_S`" in page
    assert "2 settings have no comment" in page  # timeout_s and mode
