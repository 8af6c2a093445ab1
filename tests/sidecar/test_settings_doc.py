"""Every setting is documented where it is declared, and its variable name stays its own."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from tenure.service.settings import Settings, TenantSpec


def _undocumented(model: type[BaseModel]) -> list[str]:
    return [
        name for name, field in model.model_fields.items() if not (field.description or "").strip()
    ]


def test_every_setting_has_a_docstring() -> None:
    """A field added without the docstring under it (the reference's only source) fails."""
    assert _undocumented(Settings) == []
    assert _undocumented(TenantSpec) == []


class _Bare(BaseModel):
    model_config = ConfigDict(use_attribute_docstrings=True)

    documented: int = 0
    """Said."""
    bare: int = 0


def test_the_check_sees_a_field_without_one() -> None:
    # Guards the test above: a model with a bare field is caught.
    assert _undocumented(_Bare) == ["bare"]


def test_environment_names_are_unchanged(monkeypatch) -> None:
    monkeypatch.setenv("TENURE_UPSTREAM_URL", "http://engine:8001")
    monkeypatch.setenv("TENURE_REDIS_PREFIX", "acme")
    monkeypatch.setenv("TENURE_SESSION_TTL_S", "120")
    monkeypatch.setenv("TENURE_RECORD_ENABLED", "1")
    settings = Settings(dev_mode=True)
    assert settings.upstream_url == "http://engine:8001"
    assert settings.redis_prefix == "acme"
    assert settings.session_ttl_s == 120
    assert settings.record_enabled is True
