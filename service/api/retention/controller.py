"""The online host-retention controller, run by the sidecar (one per tenant).

For each configured tenant (seed 002, section 3.4; the decision core is
:class:`~tenure.service.policy.retention_control.OnlineController`, called here, never
re-implemented):

* every replica appends the tenant's suspensions and resumes (suspend -> resume waits) to
  bounded per-tenant lists in Redis (:mod:`tenure.service.state.retention_store`);
* the replica holding the controller lease (single writer: a Redis key set with ``NX`` and an
  expiry, renewed by compare-and-set each refresh; a replica that dies loses it after
  ``retention_lease_s``) rebuilds the controller from those lists on every refresh, prices
  with lambda estimated from the suspension stream (or the SRE-pinned one: ``lambda_mode
  fixed`` in ``/admin/config``), and every ``retention_period_s`` re-chooses the branch with
  the core's hysteresis (``retention_rule``: ``branch``, the seed's retain-or-``t2``, by
  default; ``timer``, opt-in, a rent-budget scale of ``t2``, issue 26). Until a tenant has
  ``retention_min_samples`` observed waits, the SRE's calibration sample (``POST
  /admin/waits``), when there is one, is scored instead (the seed's one-shot calibration as the
  prior; the timer rule then keeps it, topping its own sample up to the window). Each
  re-choice is logged (a change at INFO), counted (``tenure_retention_decisions``) and kept
  with its reason (``GET /admin/retention``); a change is pushed to the adapters at once (a
  fresh snapshot);
* the holder keeps each tenant's rent clock (:class:`~tenure.service.policy.rent.RentClock`: the
  congestion rent ``alpha2(lambda)`` one host slot has accrued) in the tenant's view doc,
  loads it from there on every refresh and only moves it forward, re-priced at the lambda in
  use. A ttl-branch suspension gets the limit ``R(now) + beta3 - beta2`` and the adapters
  re-compute each held copy's timer from the clock in every snapshot (a rate that moved by
  more than :data:`PUSH_RATE_CHANGE` is pushed at once). A clock lost with Redis restarts
  at zero: copies held with limits on the old one wait longer, never shorter;
* the other replicas read the holder's view. The suspend route takes the branch and lambda
  from here: ``t2(lambda)`` is computed at suspension with the current price vector, so a
  vector written by ``tenure calibrate --write-sidecar`` is used by the next suspension.

Tenant isolation: a tenant's lambda and waits come only from its own suspensions and resumes,
and it is priced with its own share of the host slots (``host_slots`` / configured tenants),
so nothing one tenant does changes another's branch or timer; keys and metric labels carry
configured tenant names only. The sidecar's starting branch is ``ttl`` (a timer whenever the
tier is congested: what a suspension got before any wait was observed).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import asdict
from typing import Literal

from tenure.service.api.retention.types import INITIAL_BRANCH, RetentionKnobs, TenantRetention
from tenure.service.metrics import Metrics
from tenure.service.metrics_retention import BRANCHES, OUTCOMES, RetentionMetrics, bounded
from tenure.service.policy.lifecycle import RetentionSettings
from tenure.service.policy.rate import rate_lower_bound
from tenure.service.policy.rent import RentClock
from tenure.service.policy.retention import alpha2, hold_cost
from tenure.service.policy.retention_control import (
    OnlineController,
    OnlineSettings,
    RetentionDecision,
    rechoose_branch,
)
from tenure.service.policy.retention_costs import Branch, RetentionModel
from tenure.service.policy.retention_rule import timer_for_scale
from tenure.service.settings import Settings
from tenure.service.state.breaker import StateUnavailable
from tenure.service.state.config import RuntimeConfig
from tenure.service.state.retention_store import RetentionStore
from tenure.service.state.store import StateStore
from tenure.service.wire.push import ResumeOutcome, RetentionState

__all__ = ["PUSH_RATE_CHANGE", "RetentionControl", "build_retention"]

log = logging.getLogger(__name__)

#: A tenant's rent rate that moved by more than this (relative to the larger of the two, or
#: of alpha2 at 2 x lambda_crit) is pushed to the adapters at once; smaller moves ride the
#: periodic snapshot.
PUSH_RATE_CHANGE = 0.1


class RetentionControl:
    def __init__(
        self,
        store: RetentionStore,
        metrics: RetentionMetrics,
        *,
        tenants: Iterable[str],
        clock: Callable[[], float],
        knobs: RetentionKnobs,
        owner: str,
        on_change: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.tenants = sorted(set(tenants))
        if not self.tenants:
            raise ValueError("the retention controller needs at least one tenant")
        self.clock = clock
        self.knobs = knobs
        self.owner = owner
        self.leader = False
        #: The runtime config of the last refresh (what reports are priced with).
        self.config = RuntimeConfig()
        self.views: dict[str, TenantRetention] = {t: TenantRetention() for t in self.tenants}
        #: Called after a branch change (the app broadcasts a push snapshot).
        self.on_change = on_change
        self._rent_moved = False
        # One re-choice at a time in this replica: the periodic refresh and an admin's
        # ``decide`` each read the tenant's stored view, decide and write it back; interleaved,
        # the refresh's write (read before the admin's) undid the admin's decision, which a
        # loaded host (a slow Redis round trip in the middle) made visible (issue 23).
        self._deciding = asyncio.Lock()

    # --- what a suspension is priced with ---------------------------------------------------

    def host_slots(self, config: RuntimeConfig) -> float:
        """C2 of one tenant: its equal share of the configured host slots."""
        return max(1.0, config.host_slots / len(self.tenants))

    def model(self, config: RuntimeConfig) -> RetentionModel:
        return RetentionModel(config.price.vector(), self.host_slots(config), config.w_ref_s)

    def settings(self, config: RuntimeConfig) -> RetentionSettings:
        """The retention settings of one tenant's suspension (its share of C2)."""
        return RetentionSettings(
            price=config.price.vector(),
            host_slots=self.host_slots(config),
            w_ref_s=config.w_ref_s,
            fixed_lambda=config.lambda_fixed_per_s if config.lambda_mode == "fixed" else None,
        )

    def online_settings(self, config: RuntimeConfig) -> OnlineSettings:
        k = self.knobs
        return OnlineSettings(
            estimator=k.estimator, period_s=k.period_s, margin=k.margin,
            min_samples=k.min_samples, window=k.window, initial_branch=INITIAL_BRANCH,
            pinned_lambda=config.lambda_fixed_per_s if config.lambda_mode == "fixed" else None,
            rule=k.rule,
        )  # fmt: skip

    def view(self, tenant: str) -> TenantRetention:
        return self.views.get(tenant) or TenantRetention()

    def lambda_in_use(self, tenant: str, config: RuntimeConfig) -> tuple[float, str]:
        if config.lambda_mode == "fixed" and config.lambda_fixed_per_s is not None:
            return config.lambda_fixed_per_s, "pinned"
        return self.view(tenant).lambda_lower, "estimated"

    def suspend_inputs(self, tenant: str, config: RuntimeConfig) -> tuple[Branch, float]:
        """The branch and lambda a suspension of ``tenant`` gets now."""
        return self.view(tenant).branch, self.lambda_in_use(tenant, config)[0]

    def scale(self, tenant: str) -> float | None:
        """``tenant``'s rent-budget scale (the retention rule's choice; ``None``: retain)."""
        view = self.view(tenant)
        return None if view.branch == "retain" else view.scale

    def rent(self, tenant: str) -> RentClock:
        """``tenant``'s rent clock as the lease holder last priced it."""
        return self.view(tenant).rent()

    # --- events (every replica) -------------------------------------------------------------

    async def observe_suspension(self, tenant: str, at: float) -> None:
        if tenant not in self.views:
            return
        # Degrade: the estimate misses one event; nothing stored is wrong.
        with contextlib.suppress(StateUnavailable):
            await self.store.record_suspension(tenant, at)

    async def observe_resume(self, tenant: str, at: float, wait_s: float) -> None:
        if tenant not in self.views or not (math.isfinite(wait_s) and wait_s >= 0):
            return
        with contextlib.suppress(StateUnavailable):
            await self.store.record_resume(tenant, at, wait_s)

    # --- the loop (called on every runtime refresh) -----------------------------------------

    async def refresh(
        self, config: RuntimeConfig, calibration_waits: Sequence[float] = ()
    ) -> list[RetentionDecision]:
        """Hold the lease and control, or follow the holder; a Redis failure keeps the views."""
        self.config = config
        made: list[RetentionDecision] = []
        try:
            async with self._deciding:
                self.leader = await self.store.hold_lease(self.owner, self.knobs.lease_s)
                for tenant in self.tenants:
                    if self.leader:
                        decision = await self._control(tenant, config, calibration_waits, False)
                        if decision is not None:
                            made.append(decision)
                    else:
                        doc = await self.store.get_state(tenant)
                        if doc is not None:
                            self.views[tenant] = TenantRetention.from_doc(doc)
        except StateUnavailable:
            pass
        self.export(config)
        moved, self._rent_moved = self._rent_moved, False
        if (moved or any(d.changed for d in made)) and self.on_change is not None:
            await self.on_change()
        return made

    async def decide_now(
        self, tenant: str, config: RuntimeConfig, calibration_waits: Sequence[float] = ()
    ) -> RetentionDecision | None:
        """Re-choose ``tenant``'s branch now (admin); ``None`` if another replica holds the
        lease (the single writer)."""
        self.config = config
        async with self._deciding:
            self.leader = await self.store.hold_lease(self.owner, self.knobs.lease_s)
            if not self.leader:
                return None
            decision = await self._control(tenant, config, calibration_waits, True)
        self.export(config)
        if decision is not None and decision.changed and self.on_change is not None:
            await self.on_change()
        return decision

    async def _control(
        self,
        tenant: str,
        config: RuntimeConfig,
        calibration_waits: Sequence[float],
        force: bool,
    ) -> RetentionDecision | None:
        model, settings = self.model(config), self.online_settings(config)
        suspensions, resumes = await self.store.events(tenant)
        state = await self.store.get_state(tenant) or {}
        before = TenantRetention.from_doc(state)
        # The timer rule takes the SRE's calibration sample as its prior (alone below
        # min_samples own waits, then topping the own sample up to the window); the branch
        # rule scores it below min_samples (``_calibrated``), and its ttl is always t2.
        timer = settings.rule == "timer"
        ctl = OnlineController(
            model, settings, branch=before.branch, last_decision_at=before.decided_at,
            decisions=before.decisions, switches=before.switches,
            scale=(before.scale if timer else 1.0) if before.branch == "ttl" else None,
            prior_waits_s=tuple(calibration_waits) if timer else (),
        )  # fmt: skip
        for at in suspensions:
            ctl.observe_suspension(at)
        for at, wait in sorted(resumes):
            ctl.observe_resume(at, wait)
        assert ctl.estimator is not None and ctl.waits is not None and ctl.cohort is not None
        now = self.clock()
        decision: RetentionDecision | None = None
        if force or ctl.due(now):
            if not timer and len(ctl.waits) < settings.min_samples and calibration_waits:
                decision = self._calibrated(ctl, calibration_waits, now)
            else:
                # The timer rule takes the calibration sample as its prior itself.
                decision = ctl.decide(now)
        lam_lower = rate_lower_bound(ctl.estimator, now, settings.lambda_z)
        # The clock comes from the stored view, never from ``ctl`` (rebuilt from the window
        # each refresh, its rent would restart and jump back).
        rent = before.rent()
        lam = settings.pinned_lambda if settings.pinned_lambda is not None else lam_lower
        rate = alpha2(lam, model.c2, model.w_ref_s, model.price.beta3)
        # beta3 / W_ref is alpha2 at 2 x lambda_crit: noise in a near-critical estimate (tiny
        # rates, large relative moves) waits for the periodic snapshot.
        scale = max(rate, rent.rate, model.price.beta3 / model.w_ref_s)
        self._rent_moved |= abs(rate - rent.rate) > PUSH_RATE_CHANGE * scale
        rent.reprice(now, rate)
        view = TenantRetention(
            branch=ctl.branch or INITIAL_BRANCH,
            lambda_estimate=ctl.estimator.rate(now),
            lambda_lower=lam_lower,
            observed_waits=len(ctl.waits),
            pending=ctl.cohort.pending(),
            decided_at=ctl.last_decision_at,
            decisions=ctl.decisions,
            switches=ctl.switches,
            reason=before.reason if decision is None else decision.reason,
            updated_at=now,
            rent_accrued=rent.accrued,
            rent_at=rent.at,
            rent_rate=rent.rate,
            scale=ctl.scale,
            choice=before.choice if decision is None or not decision.choice else decision.choice,
        )
        await self.store.put_state(tenant, asdict(view))
        self.views[tenant] = view
        if decision is not None:
            await self.store.log_decision(tenant, {"tenant": tenant, **decision.to_dict()})
            self.metrics.decisions.labels(tenant, "true" if decision.changed else "false").inc()
            level = logging.INFO if decision.changed else logging.DEBUG
            log.log(level, "retention[%s]: %s", tenant, decision.reason)
        return decision

    @staticmethod
    def _calibrated(ctl: OnlineController, waits: Sequence[float], now: float) -> RetentionDecision:
        """The branch rule: score the SRE's calibration sample while the tenant's own is too
        small."""
        assert ctl.branch is not None and ctl.waits is not None
        lam, source = ctl.lam(now)
        lam_source: Literal["estimated", "pinned"] = "pinned" if source == "pinned" else source
        decision = rechoose_branch(
            ctl.model, waits, lam, ctl.branch, now=now, margin=ctl.settings.margin,
            evaluator=ctl.settings.evaluator, lam_source=lam_source, seed=ctl.decisions,
        )  # fmt: skip
        ctl.branch = decision.branch
        ctl.scale = None if decision.branch == "retain" else 1.0
        ctl.last_decision_at = now
        ctl.decisions += 1
        ctl.switches += int(decision.changed)
        note = (
            f"{len(ctl.waits)} observed waits < {ctl.settings.min_samples}: scored the "
            f"calibration sample ({len(waits)} waits from POST /admin/waits); "
        )
        return RetentionDecision(**{**decision.to_dict(), "reason": note + decision.reason})

    # --- resume outcomes (the adapters' reports) ---------------------------------------------

    def record_resumes(
        self, outcomes: Iterable[ResumeOutcome], config: RuntimeConfig | None = None
    ) -> None:
        """Count each reported resume and its GPU opportunity cost (seed 002, eq. 1).

        ``hbm``: the context sat in HBM for the wait (``alpha1 x wait``); ``host``: held on
        host, then restored (``alpha2(lambda) x held + beta2``); ``recomputed``: its host copy
        was held (``alpha2 x held``, zero without congestion) and then recomputed
        (``+ beta3``). ``alpha2`` is the tenant's congestion price at the lambda in use.
        """
        config = config or self.config
        m, price = self.metrics, config.price.vector()
        for out in outcomes:
            branch, outcome = bounded(out.branch, BRANCHES), bounded(out.outcome, OUTCOMES)
            m.resumes.labels(branch, outcome).inc()
            for source, tokens in (
                ("hbm", out.hbm_tokens), ("host", out.host_tokens),
                ("computed", out.computed_tokens),
            ):  # fmt: skip
                if tokens > 0:
                    m.resume_tokens.labels(source).inc(tokens)
            if outcome == "other":
                continue
            wait = max(0.0, out.wait_s) if math.isfinite(out.wait_s) else 0.0
            held = max(0.0, out.host_held_s) if math.isfinite(out.host_held_s) else 0.0
            price_2 = 0.0
            if out.tenant in self.views:
                lam = self.lambda_in_use(out.tenant, config)[0]
                model = self.model(config)
                price_2 = alpha2(lam, model.c2, model.w_ref_s, price.beta3)
            if outcome == "hbm":
                cost = hold_cost(price.alpha1, 0.0, wait)
            elif outcome == "host":
                cost = hold_cost(price_2, price.beta2, held)
            else:
                cost = hold_cost(price_2, price.beta3, held)
            m.resume_cost.labels(branch, outcome).observe(cost)

    # --- outputs ------------------------------------------------------------------------------

    def host_ttl(self, tenant: str, config: RuntimeConfig) -> float | None:
        """The timer a suspension of ``tenant`` gets now at a constant price: the rule's
        scale times ``t2`` (``None``: retained until resume)."""
        _, lam = self.suspend_inputs(tenant, config)
        return timer_for_scale(self.model(config), self.scale(tenant), lam)

    def push_state(self, config: RuntimeConfig) -> dict[str, RetentionState]:
        out: dict[str, RetentionState] = {}
        for tenant in self.tenants:
            view = self.view(tenant)
            out[tenant] = RetentionState(
                branch=view.branch,
                host_ttl_s=self.host_ttl(tenant, config),
                lambda_per_s=self.lambda_in_use(tenant, config)[0],
                decided_at=view.decided_at or 0.0,
                rent_accrued=view.rent_accrued,
                rent_at=view.rent_at,
                rent_rate=view.rent_rate,
            )
        return out

    def export(self, config: RuntimeConfig) -> None:
        m = self.metrics
        m.lease_held.set(1 if self.leader else 0)
        model, now = self.model(config), self.clock()
        for tenant in self.tenants:
            view = self.view(tenant)
            m.rent_rate.labels(tenant).set(view.rent_rate)
            m.rent_accrued.labels(tenant).set(view.rent().value(now))
            lam, source = self.lambda_in_use(tenant, config)
            m.lambda_estimate.labels(tenant).set(view.lambda_estimate)
            m.lambda_in_use.labels(tenant).set(lam)
            m.lambda_pinned.labels(tenant).set(1 if source == "pinned" else 0)
            m.lambda_crit.labels(tenant).set(model.lambda_crit)
            ttl = self.host_ttl(tenant, config)
            m.host_ttl.labels(tenant).set(-1.0 if ttl is None else ttl)
            for branch in BRANCHES:
                m.branch.labels(tenant, branch).set(1 if view.branch == branch else 0)
            m.suspended.labels(tenant).set(view.pending)
            m.host_slots.labels(tenant).set(model.c2)
            m.observed_waits.labels(tenant).set(view.observed_waits)


def build_retention(
    settings: Settings,
    store: StateStore,
    metrics: Metrics,
    clock: Callable[[], float],
    on_change: Callable[[], Awaitable[None]] | None = None,
) -> RetentionControl:
    """The app's controller: the configured tenants (or the default one), knobs from settings,
    and this replica's lease identity (host, process, a random part: never a secret)."""
    tenants = sorted({spec.name for spec in settings.tenants.values()}) or [
        settings.default_tenant.name
    ]
    knobs = RetentionKnobs(
        period_s=settings.retention_period_s, min_samples=settings.retention_min_samples,
        margin=settings.retention_margin, estimator=settings.retention_estimator,
        window=settings.retention_window, lease_s=settings.retention_lease_s,
        rule=settings.retention_rule,
    )  # fmt: skip
    owner = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    control = RetentionControl(
        RetentionStore(store, window=knobs.window), metrics.retention, tenants=tenants,
        clock=clock, knobs=knobs, owner=owner, on_change=on_change,
    )  # fmt: skip
    return control
