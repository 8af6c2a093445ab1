"""Admin REST of the online host-retention controller (bearer token, like all of ``/admin``).

* ``GET /admin/retention``: per tenant, the branch in use, lambda (estimated, in use, and
  whether an SRE pinned it), lambda_crit, C2, the t2 a suspension gets now, the rent clock
  that re-prices held copies (rate in use, accrued now, and as stored), the controller's
  sample sizes and its last reason;
* ``GET /admin/retention/decisions?tenant=T``: that tenant's recent re-choices, newest first;
* ``POST /admin/retention/decide?tenant=T``: re-choose now instead of at the next period
  (409 when another replica holds the controller lease: it is the single writer).

Pinning lambda is ``PATCH /admin/config`` with ``{"lambda_mode": "fixed",
"lambda_fixed_per_s": X}`` (``{"lambda_mode": "auto"}`` unpins); the price vector, ``host_slots``
and ``w_ref_s`` are set there too, validated with a 422 naming the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel

from tenure.service.api.retention.controller import RetentionControl
from tenure.service.api.routes.deps import (
    ApiError,
    Services,
    error_responses,
    get_services,
    require_admin,
)
from tenure.service.api.turns.runtime import CALIBRATION_SAMPLES

__all__ = ["router"]

router = APIRouter(
    prefix="/admin/retention",
    tags=["admin"],
    dependencies=[Depends(require_admin)],
    responses=error_responses(401, 409, 422, 503),
)
Svc = Annotated[Services, Depends(get_services)]


class TenantRetentionView(BaseModel):
    tenant: str
    branch: str
    lambda_estimate_per_s: float
    lambda_in_use_per_s: float
    lambda_source: str
    lambda_crit_per_s: float
    host_slots: float
    #: What a suspension gets now; null = retained until resume.
    host_ttl_s: float | None
    #: The rent clock: GPU-s per held second charged now (alpha2 at the lambda in use), the
    #: rent accrued now, and the stored clock (accrued at ``rent_at``, Unix s).
    rent_rate_gpu_s_per_s: float
    rent_now_gpu_s: float
    rent_accrued_gpu_s: float
    rent_at: float | None
    observed_waits: int
    suspended: int
    decisions: int
    switches: int
    decided_at: float | None
    reason: str
    #: The retention rule's rent-budget scale (``host_ttl_s`` is it times t2; null: retain).
    timer_scale: float | None = None
    #: The rule's last scored choice: the scale, its expected cost beside retain's and t2's,
    #: the bootstrap sd, and ``sample`` (source ``observed`` or ``calibration``, size,
    #: mean and quantiles of the waits it was chosen on). Null before the first one.
    choice: dict[str, Any] | None = None


class RetentionView(BaseModel):
    leader: bool
    period_s: float
    min_samples: int
    margin: float
    estimator: str
    tenants: list[TenantRetentionView]


class RetentionDecisions(BaseModel):
    tenant: str
    decisions: list[dict[str, Any]]


def _control(svc: Services) -> RetentionControl:
    return svc.runtime.retention


def _tenant(control: RetentionControl, tenant: str) -> str:
    if tenant not in control.tenants:
        raise ApiError(
            422,
            f"tenant: unknown tenant {tenant!r}; configured: {', '.join(control.tenants)}",
            code="invalid_tenant",
        )
    return tenant


def _view(control: RetentionControl, svc: Services) -> RetentionView:
    config = svc.runtime.config
    model = control.model(config)
    rows, now = [], svc.clock()
    for tenant in control.tenants:
        view = control.view(tenant)
        lam, source = control.lambda_in_use(tenant, config)
        rows.append(
            TenantRetentionView(
                tenant=tenant,
                branch=view.branch,
                lambda_estimate_per_s=view.lambda_estimate,
                lambda_in_use_per_s=lam,
                lambda_source=source,
                lambda_crit_per_s=model.lambda_crit,
                host_slots=model.c2,
                host_ttl_s=control.host_ttl(tenant, config),
                rent_rate_gpu_s_per_s=view.rent_rate,
                rent_now_gpu_s=view.rent().value(now),
                rent_accrued_gpu_s=view.rent_accrued,
                rent_at=view.rent_at,
                observed_waits=view.observed_waits,
                suspended=view.pending,
                decisions=view.decisions,
                switches=view.switches,
                decided_at=view.decided_at,
                reason=view.reason,
                timer_scale=control.scale(tenant),
                choice=view.choice,
            )
        )
    k = control.knobs
    return RetentionView(
        leader=control.leader, period_s=k.period_s, min_samples=k.min_samples, margin=k.margin,
        estimator=k.estimator, tenants=rows,
    )  # fmt: skip


@router.get("", response_model=RetentionView)
async def retention_state(svc: Svc) -> RetentionView:
    return _view(_control(svc), svc)


@router.get("/decisions", response_model=RetentionDecisions)
async def retention_decisions(
    svc: Svc,
    tenant: Annotated[str, Query(max_length=64)],
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> RetentionDecisions:
    control = _control(svc)
    name = _tenant(control, tenant)
    return RetentionDecisions(tenant=name, decisions=await control.store.decisions(name, limit))


@router.post("/decide", response_model=RetentionView)
async def retention_decide(svc: Svc, tenant: Annotated[str, Query(max_length=64)]) -> RetentionView:
    control = _control(svc)
    name = _tenant(control, tenant)
    # Fresh from Redis: a sample posted a moment ago counts (the refresh may not have run).
    waits = await svc.store.float_samples("calibration_waits", CALIBRATION_SAMPLES)
    decision = await control.decide_now(name, svc.runtime.config, waits)
    if decision is None:
        raise ApiError(409, "another sidecar replica holds the retention lease", code="not_leader")
    return _view(control, svc)
