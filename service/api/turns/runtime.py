"""What each replica caches from Redis: the runtime config and the learned gap models.

Redis holds the shared truth (the config document, the per-tenant gap-observation log, wait
samples); every replica rebuilds its local copies from it on a short period, so several
replicas on one Redis decide alike. The gap model is persisted as its observation log rather
than as a serialised predictor: appends from many replicas are atomic and ordered, while a
read-modify-write of a serialised model would lose concurrent updates. Between refreshes a
replica also learns at once from the gaps it observes itself. The host-retention regime (each
tenant's lambda, branch and TTL) is the retention controller's
(:mod:`tenure.service.api.retention.controller`), refreshed here with the rest.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from tenure.service.api.retention.controller import RetentionControl
from tenure.service.metrics import Metrics
from tenure.service.policy import GapPredictor, stop_class
from tenure.service.policy.retention import lambda_crit
from tenure.service.state.breaker import StateUnavailable
from tenure.service.state.config import RuntimeConfig
from tenure.service.state.store import YIELD_EVERY, StateStore

__all__ = ["Runtime"]

log = logging.getLogger(__name__)

#: Calibration waits the regime controller replays (newest first in Redis).
CALIBRATION_SAMPLES = 1024
#: Live sessions sampled per tenant for the sessions-by-state gauge.
STATE_SAMPLE = 2000


class Runtime:
    def __init__(
        self,
        store: StateStore,
        metrics: Metrics,
        *,
        gap_log_len: int,
        tenants: Iterable[str],
        retention: RetentionControl,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.gap_log_len = gap_log_len
        self.config = RuntimeConfig()
        self.calibration_waits: list[float] = []
        self._predictors: dict[str, GapPredictor] = {}
        self._gap_heads: dict[str, tuple[int, str]] = {}
        self._tenants: set[str] = set(tenants)
        #: The online host-retention controller (refreshed with the rest).
        self.retention = retention

    # --- decisions' inputs ---------------------------------------------------------------------

    def predictor(self, tenant: str) -> GapPredictor:
        predictor = self._predictors.get(tenant)
        if predictor is None:
            predictor = self._predictors[tenant] = GapPredictor()
            self._tenants.add(tenant)
        return predictor

    def observe_gap(
        self, tenant: str, stop_reason: str, tool: str, gap_s: float, expected_s: float | None
    ) -> None:
        """Learn one observed gap now (the refresh later replaces this with the shared log)."""
        self.predictor(tenant).observe(stop_reason or None, gap_s, tool or None)
        cls = stop_class(stop_reason or None)
        self.metrics.gap_observed.labels(cls).observe(gap_s)
        if expected_s is not None:
            self.metrics.gap_prediction_error.labels(cls).observe(abs(gap_s - expected_s))

    # --- refresh from Redis ------------------------------------------------------------------

    async def refresh(self, *, sample_states: bool = False) -> None:
        """Reload everything shared; a Redis failure keeps the cached copies."""
        try:
            await self._refresh_config()
            for tenant in list(self._tenants):
                await self._refresh_gaps(tenant)
            self.calibration_waits = await self.store.float_samples(
                "calibration_waits", CALIBRATION_SAMPLES
            )
            if sample_states:
                await self._sample_states()
        except StateUnavailable:
            pass
        await self.retention.refresh(self.config, self.calibration_waits)
        config = self.config
        self.metrics.lambda_crit.set(lambda_crit(config.host_slots, config.w_ref_s))

    async def _refresh_config(self) -> None:
        held = self.config
        doc = await self.store.get_config()
        if doc is None or self.config is not held:
            # An admin's PATCH set a newer config while this read was in flight: the document
            # read may predate its write, and would put the old config back until the next
            # refresh (a loaded host widens that window; issue 23).
            return
        try:
            self.config = RuntimeConfig.model_validate(doc)
        except ValueError:
            log.warning("ignoring an invalid runtime config document in Redis")

    async def _refresh_gaps(self, tenant: str) -> None:
        head = await self.store.gap_log_head(tenant)
        if head == self._gap_heads.get(tenant):
            return
        observations = await self.store.gap_observations(tenant, self.gap_log_len)
        predictor = GapPredictor()
        for i, obs in enumerate(observations):
            predictor.observe(obs.stop_reason or None, obs.gap_s, obs.tool or None)
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)
        self._predictors[tenant] = predictor
        self._gap_heads[tenant] = head

    async def _sample_states(self) -> None:
        counts: dict[str, int] = {}
        for tenant in list(self._tenants):
            for record in await self.store.list_sessions(tenant, limit=STATE_SAMPLE):
                state = record.state if record.state is not None else ""
                counts[state] = counts.get(state, 0) + 1
        self.metrics.set_sessions(counts)
