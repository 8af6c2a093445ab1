"""Runtime configuration SREs change through ``/admin/config`` (stored in Redis, shared).

Every field is validated with its unit in the name; ``PATCH`` bodies are partial documents
validated against :class:`ConfigPatch` (unknown fields rejected), merged, and the result
validated again as a whole (cross-field rules such as ``beta3 >= beta2``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tenure.service.policy import policy_names
from tenure.service.policy.lifecycle import RetentionSettings
from tenure.service.policy.retention import DEFAULT_PRICE, PriceVector

__all__ = ["ConfigPatch", "PriceConfig", "PricePatch", "RuntimeConfig"]

_MAX_BYTES = 1 << 60
_TIER_NAME = r"^[A-Za-z0-9_-]{1,32}$"


class PriceConfig(BaseModel):
    """The per-platform price vector (seed 002): GPU-s/s and GPU-s."""

    model_config = ConfigDict(extra="forbid")

    alpha1_gpu_s_per_s: float = Field(
        default=DEFAULT_PRICE.alpha1, gt=0, le=1e6, allow_inf_nan=False
    )
    beta2_gpu_s: float = Field(default=DEFAULT_PRICE.beta2, ge=0, le=1e6, allow_inf_nan=False)
    # beta3 > 0: a free recompute makes every timer zero (the retention model refuses it, so
    # a stored zero would stop the controller's every refresh).
    beta3_gpu_s: float = Field(
        default=DEFAULT_PRICE.beta3, gt=0, le=1e6, allow_inf_nan=False, validate_default=True
    )

    @field_validator("beta3_gpu_s")
    @classmethod
    def _recompute_costs_more(cls, value: float, info: ValidationInfo) -> float:
        # A field validator (not a model one) so the 422 names the field.
        beta2 = info.data.get("beta2_gpu_s")
        if beta2 is not None and value < beta2:
            raise ValueError("beta3_gpu_s (recompute) must be >= beta2_gpu_s (host resume)")
        return value

    def vector(self) -> PriceVector:
        return PriceVector(self.alpha1_gpu_s_per_s, self.beta2_gpu_s, self.beta3_gpu_s)


def _absent() -> Any:
    """The default of a patch field: absent. ``exclude_unset`` drops it from the merge, and
    a factory's default is neither validated nor shown in the schema (it is not null)."""
    return None


def _not_null(value: object, field: str) -> object:
    if value is None:
        raise ValueError(f"{field} cannot be null; leave it out to keep the current value")
    return value


class PricePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    alpha1_gpu_s_per_s: float = Field(default_factory=_absent, gt=0, le=1e6, allow_inf_nan=False)
    beta2_gpu_s: float = Field(default_factory=_absent, ge=0, le=1e6, allow_inf_nan=False)
    beta3_gpu_s: float = Field(default_factory=_absent, gt=0, le=1e6, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _present(cls, value: object, info: ValidationInfo) -> object:
        return _not_null(value, str(info.field_name))


def _check_policy(value: str) -> str:
    names = policy_names()
    if value not in names:
        raise ValueError(f"unknown policy {value!r}; valid: {', '.join(names)}")
    return value


def _check_tiers(value: dict[str, int]) -> dict[str, int]:
    import re

    for tier in value:
        if not re.match(_TIER_NAME, tier):
            raise ValueError(f"tier name {tier!r} must be 1-32 characters of [A-Za-z0-9_-]")
    return value


class RuntimeConfig(BaseModel):
    """The whole runtime configuration document."""

    model_config = ConfigDict(extra="forbid")

    policy_mode: str = "tenure"
    #: Host capacity per tier, bytes (``cpu`` is the host DRAM tier the gate enforces).
    host_capacity_bytes: dict[str, int] = Field(default_factory=dict, max_length=16)
    #: C2: suspended contexts the host tier holds.
    host_slots: float = Field(default=425.0, gt=0, le=1e9, allow_inf_nan=False)
    #: W_ref: reference residence of a suspended context, seconds.
    # ge=1 s: W_ref is a human-approval timescale; a tiny one makes lambda_crit = C2 / W_ref
    # overflow to inf (an answer JSON cannot carry).
    w_ref_s: float = Field(default=1800.0, ge=1.0, le=30 * 86400, allow_inf_nan=False)
    lambda_mode: Literal["auto", "fixed"] = "auto"
    #: The suspension rate used when ``lambda_mode`` is ``fixed``, per second.
    lambda_fixed_per_s: float | None = Field(
        default=None, ge=0, le=1e6, allow_inf_nan=False, validate_default=True
    )
    price: PriceConfig = Field(default_factory=lambda: PriceConfig())
    overdue_slack_s: float = Field(default=30.0, ge=0, le=86400, allow_inf_nan=False)
    version: int = Field(default=0, ge=0)

    @field_validator("policy_mode")
    @classmethod
    def _policy(cls, value: str) -> str:
        return _check_policy(value)

    @field_validator("host_capacity_bytes")
    @classmethod
    def _tiers(cls, value: dict[str, int]) -> dict[str, int]:
        for tier, size in value.items():
            if size < 0 or size > _MAX_BYTES:
                raise ValueError(f"capacity of tier {tier!r} must be 0..2^60 bytes")
        return _check_tiers(value)

    @field_validator("lambda_fixed_per_s")
    @classmethod
    def _fixed_needs_value(cls, value: float | None, info: ValidationInfo) -> float | None:
        if info.data.get("lambda_mode") == "fixed" and value is None:
            raise ValueError("lambda_mode 'fixed' needs lambda_fixed_per_s")
        return value

    def retention(self) -> RetentionSettings:
        return RetentionSettings(
            price=self.price.vector(),
            host_slots=self.host_slots,
            w_ref_s=self.w_ref_s,
            fixed_lambda=self.lambda_fixed_per_s if self.lambda_mode == "fixed" else None,
        )


class ConfigPatch(BaseModel):
    """A partial update: only the fields present change. No field takes null except
    ``lambda_fixed_per_s`` (null clears a fixed rate); the schema says exactly that."""

    model_config = ConfigDict(extra="forbid")

    policy_mode: str = Field(default_factory=_absent)
    host_capacity_bytes: dict[str, int] = Field(default_factory=_absent, max_length=16)
    host_slots: float = Field(default_factory=_absent, gt=0, le=1e9, allow_inf_nan=False)
    w_ref_s: float = Field(default_factory=_absent, ge=1.0, le=30 * 86400, allow_inf_nan=False)
    lambda_mode: Literal["auto", "fixed"] = Field(default_factory=_absent)
    lambda_fixed_per_s: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    price: PricePatch = Field(default_factory=_absent)
    overdue_slack_s: float = Field(default_factory=_absent, ge=0, le=86400, allow_inf_nan=False)

    @field_validator(
        "policy_mode", "host_capacity_bytes", "host_slots", "w_ref_s", "lambda_mode", "price",
        "overdue_slack_s", mode="before",
    )  # fmt: skip
    @classmethod
    def _present(cls, value: object, info: ValidationInfo) -> object:
        return _not_null(value, str(info.field_name))

    @field_validator("policy_mode")
    @classmethod
    def _policy(cls, value: str | None) -> str | None:
        return None if value is None else _check_policy(value)

    @field_validator("host_capacity_bytes")
    @classmethod
    def _tiers(cls, value: dict[str, int] | None) -> dict[str, int] | None:
        if value is None:
            return None
        for tier, size in value.items():
            if size < 0 or size > _MAX_BYTES:
                raise ValueError(f"capacity of tier {tier!r} must be 0..2^60 bytes")
        return _check_tiers(value)

    def merged_into(self, current: RuntimeConfig) -> dict[str, Any]:
        """The full document after this patch (validated by the caller as a RuntimeConfig)."""
        doc = current.model_dump()
        changes = self.model_dump(exclude_unset=True)
        price_changes = changes.pop("price", None) or {}
        doc.update({k: v for k, v in changes.items()})
        doc["price"].update({k: v for k, v in price_changes.items() if v is not None})
        doc["version"] = current.version + 1
        return doc
