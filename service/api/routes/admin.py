"""Admin REST for SREs (bearer token): runtime config, recent decisions, wait samples, engines.

``PATCH /admin/config`` validates the patch, merges it into the current document and validates
the result as a whole; any problem is a 422 naming the field. The new config is stored in Redis
(shared by every replica) and pushed to adapters in a fresh snapshot.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Query
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from tenure.service.api.routes.deps import Services, error_responses, get_services, require_admin
from tenure.service.state.config import ConfigPatch, RuntimeConfig

__all__ = ["router"]

router = APIRouter(
    prefix="/admin",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses=error_responses(400, 401, 413, 422, 503),
)
Svc = Annotated[Services, Depends(get_services)]


class DecisionView(BaseModel):
    seq: int
    session_id: str
    state: str
    turn: int
    expected_gap_s: float | None
    wakeup_at: float | None
    last_turn: bool
    host_ttl_s: float | None
    parent: str | None
    reason: str
    issued_at: float


class DecisionList(BaseModel):
    decisions: list[DecisionView]


class WaitSamples(BaseModel):
    model_config = ConfigDict(extra="forbid")

    #: Observed approval waits, seconds (calibration for the retain-vs-TTL controller).
    waits_s: list[float] = Field(min_length=1, max_length=10_000)

    @field_validator("waits_s")
    @classmethod
    def _finite(cls, values: list[float]) -> list[float]:
        for value in values:
            if not math.isfinite(value) or value < 0 or value > 30 * 86400:
                raise ValueError("every wait must be a finite number of seconds in [0, 30 days]")
        return values


class WaitSamplesStored(BaseModel):
    stored: int
    total: int


async def _current(svc: Services) -> RuntimeConfig:
    doc = await svc.store.get_config()
    if doc is None:
        return RuntimeConfig()
    try:
        return RuntimeConfig.model_validate(doc)
    except ValidationError:
        return RuntimeConfig()


@router.get("/config", response_model=RuntimeConfig)
async def get_config(svc: Svc) -> RuntimeConfig:
    config = await _current(svc)
    svc.runtime.config = config
    return config


@router.patch("/config", response_model=RuntimeConfig)
async def patch_config(patch: ConfigPatch, svc: Svc) -> RuntimeConfig:
    result: dict[str, RuntimeConfig] = {}

    def merge(current_doc: dict[str, Any] | None) -> dict[str, Any]:
        try:
            current = RuntimeConfig.model_validate(current_doc or {})
        except ValidationError:
            current = RuntimeConfig()
        try:
            merged = RuntimeConfig.model_validate(patch.merged_into(current))
        except ValidationError as exc:
            raise RequestValidationError(
                [
                    {"type": err["type"], "loc": ("body", *err["loc"]), "msg": err["msg"]}
                    for err in exc.errors()
                ]
            ) from None
        result["config"] = merged
        return merged.model_dump()

    await svc.store.update_config(merge)
    config = result["config"]
    svc.runtime.config = config
    if svc.push is not None:
        await svc.push.broadcast_snapshot()
    return config


@router.get("/decisions", response_model=DecisionList)
async def recent_decisions(
    svc: Svc, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> DecisionList:
    """The newest decisions first, each with the reason the core gave."""
    found = await svc.store.recent_decisions(limit)
    return DecisionList(
        decisions=[DecisionView.model_validate(msgspec.structs.asdict(d)) for d in found]
    )


@router.post("/waits", response_model=WaitSamplesStored)
async def add_waits(samples: WaitSamples, svc: Svc) -> WaitSamplesStored:
    total = await svc.store.add_wait_samples(samples.waits_s)
    return WaitSamplesStored(stored=len(samples.waits_s), total=total)


class EngineView(BaseModel):
    #: The engine's id (its adapter's configured ``TENURE_ENGINE_ID``, a bounded label).
    engine: str
    resident_bytes: dict[str, int]
    sessions_tracked: int
    last_applied_seq: int
    policy: str
    reported_at: float
    #: Sessions that arrived at this engine with earlier turns it never saw (router moves).
    sessions_moved_in: int


class EngineList(BaseModel):
    engines: list[EngineView]


@router.get("/engines", response_model=EngineList)
async def engines(svc: Svc) -> EngineList:
    """Per-engine residency as each engine's adapter last reported it (to any replica)."""
    rows = await svc.store.engines()
    return EngineList(
        engines=[
            EngineView(
                engine=name,
                resident_bytes={
                    str(k): int(v) for k, v in summary.get("resident_bytes", {}).items()
                },
                sessions_tracked=int(summary.get("sessions_tracked", 0)),
                last_applied_seq=int(summary.get("last_applied_seq", -1)),
                policy=str(summary.get("policy", "")),
                reported_at=float(summary.get("reported_at", 0.0)),
                sessions_moved_in=moves,
            )
            for name, summary, moves in rows
        ]
    )
