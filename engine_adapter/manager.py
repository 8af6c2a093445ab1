"""vLLM's CPU offloading manager with the seams Tenure's gate needs and ``CachePolicy`` lacks.

The stock manager asks its policy for victims without saying who is storing, frees chunks only
inside a store, and never wakes the policy up on its own. This subclass, built by
:class:`~tenure.engine_adapter.spec.TenureOffloadingSpec`, adds exactly that and nothing else:

* the whole offer is put to the core's gate (with the storing request) before vLLM evicts, and
  a refused offer is refused outright;
* chunks the policy drops outside a store (reclaim on a last turn, an expired host TTL, a pushed
  decision) go straight back to the pool;
* pushed decisions and timers are applied on the scheduler thread at each step end, and
  ``has_pending_work`` keeps the engine stepping while one is due.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from vllm.v1.kv_offload.base import (
    LoadStoreSpec,
    LookupResult,
    OffloadingEvent,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from tenure.engine_adapter.policy import TenureCachePolicy
from tenure.engine_adapter.requests import RequestInfo
from tenure.engine_adapter.vllm_compat import (
    add_evictable_chunks,
    free_chunk,
    manager_policy,
    num_evictable_chunks,
    num_free_chunks,
    reported_store_misses,
)

__all__ = ["TenureOffloadingManager"]

log = logging.getLogger("vllm.tenure")


class TenureOffloadingManager(CPUOffloadingManager):
    """``CPUOffloadingManager`` + store gate, out-of-band frees and timers for Tenure policies."""

    def __init__(
        self,
        *args: Any,
        block_tokens: int = 0,
        bytes_per_block: int = 0,
        policy_params: Any = None,
        push: Callable[[TenureCachePolicy], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """``policy_params``: the Tenure core's parameters (``tenure_policy_params``); ``push``
        connects the Tenure policy to the sidecar (returns the engine's push connection). Both
        apply only when the policy is a Tenure one."""
        super().__init__(*args, **kwargs)
        # vLLM's base class builds the policy by name with its capacity only: what else it
        # needs is given here, before the manager's first call.
        policy = manager_policy(self)
        self.tenure: TenureCachePolicy | None = (
            policy if isinstance(policy, TenureCachePolicy) else None
        )
        self.bytes_per_block = bytes_per_block
        #: The engine's push connection, when the policy is a Tenure one and one is configured.
        self.push_client: Any = None
        tenure = self.tenure
        if tenure is None:
            return
        tenure.can_release = True
        tenure.requests.reports_lookups = True  # lookup and prepare_load below pass them on
        tenure.block_tokens = block_tokens
        if policy_params is not None:
            if not isinstance(policy_params, dict):
                raise ValueError("kv_connector_extra_config.tenure_policy_params must be a dict")
            tenure.configure(policy_params)
        if push is not None:
            self.push_client = push(tenure)
        else:
            log.info("tenure: no push channel configured; lifecycle tags from requests only")

    # --- chunk pool -------------------------------------------------------------------------

    def _reclaim(self) -> None:
        """Return the chunks the policy dropped outside a store to the free pool."""
        assert self.tenure is not None
        released = self.tenure.take_released()
        if not released:
            return
        for _key, chunk in released:
            # The policy releases only idle chunks (ref_cnt 0), which the manager counts as
            # evictable.
            add_evictable_chunks(self, -1)
            free_chunk(self, chunk)
        if self.events is not None:
            self.events.append(
                OffloadingEvent(keys=[k for k, _ in released], medium=self.medium, removed=True)
            )

    def _poll(self) -> None:
        assert self.tenure is not None
        self.tenure.poll()
        self._reclaim()

    # --- OffloadingManager ------------------------------------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        out = super().on_new_request(req_context)
        if self.tenure is not None:
            self._poll()
            self.tenure.on_new_request(req_context)
            self._reclaim()
        return out

    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        tenure = self.tenure
        if tenure is None:
            return super().prepare_store(keys, req_context)
        keys = list(keys)
        self._poll()
        get = tenure.get
        offer = keys
        to_store = [k for k in keys if get(k) is None]
        if self.counts is not None and to_store:
            to_store = self._past_threshold(keys, to_store)
            passing = set(to_store)
            offer = [k for k in keys if k in passing or get(k) is not None]
        need = len(to_store) - num_free_chunks(self)
        try:
            if need > num_evictable_chunks(self) and need > 0:
                # vLLM refuses this store before asking for victims (in-flight transfers pin
                # the room): the gate is not asked, so nothing is decided for a store that
                # cannot happen.
                tenure.stats["refusals_pinned"] += 1
                tenure.request_computes(req_context)
                reported = reported_store_misses(self, req_context)
                fresh = [k for k in to_store if k not in reported]
                if fresh:
                    tenure.gate.report_misses(fresh, req_context)
                return super().prepare_store(keys, req_context)
            reported = reported_store_misses(self, req_context)
            admitted = tenure.gate.begin_store(offer, req_context, reported=reported)
            if not admitted and need <= 0:
                # vLLM would store without asking for victims: refuse here.
                return None
            return super().prepare_store(keys, req_context)
        finally:
            tenure.gate.end_store()
            self._reclaim()

    def _past_threshold(
        self, keys: list[OffloadKey], missing: list[OffloadKey]
    ) -> list[OffloadKey]:
        """The misses vLLM's store-threshold filter will let through once this offer counts.

        vLLM's ``prepare_store`` first counts the offer (each occurrence of a tracked key adds
        one; an untracked key enters at one) and then stores only the misses counted at least
        ``store_threshold`` times. Read here without changing the counts, so the gate decides
        exactly the store vLLM will make.
        """
        counts = self.counts
        assert counts is not None
        seen: dict[OffloadKey, int] = {}
        for key in keys:
            seen[key] = seen.get(key, 0) + 1
        threshold = self.store_threshold
        return [k for k in missing if k in counts and counts[k] + seen[k] >= threshold]

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        result = super().lookup(key, req_context)
        if self.tenure is not None:
            # Where vLLM starts looking up is where the GPU prefix-cache hit ends.
            self.tenure.requests.looked_up(key, req_context)
        return result

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        if self.tenure is not None:
            self.tenure.request_loads(len(keys), req_context)
        spec = super().prepare_load(keys, req_context)
        if self.tenure is not None:
            stats = self.tenure.stats
            stats["loads"] += 1
            stats["host_hit_blocks"] += len(keys)
            stats["bytes_loaded"] += len(keys) * self.bytes_per_block
        return spec

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        super().complete_store(keys, req_context, success)
        if self.tenure is not None:
            if success:
                self.tenure.stats["bytes_stored"] += len(keys) * self.bytes_per_block
            self._reclaim()

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        super().complete_load(keys, req_context)
        if self.tenure is not None:
            self._reclaim()

    def on_request_finished(self, req_context: ReqContext) -> None:
        super().on_request_finished(req_context)
        if self.tenure is not None:
            # What the request looked up and loaded is on its state (kept across a clear()).
            info = req_context.get_state(RequestInfo)
            lookup_end, loaded = (info.lookup_end, info.loaded) if info is not None else (None, 0)
            self.tenure.resumes.finish(req_context, lookup_end, loaded)
            self._reclaim()

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        super().on_schedule_end(context)
        if self.tenure is not None:
            self._poll()

    def has_pending_work(self) -> bool:
        if super().has_pending_work():
            return True
        tenure = self.tenure
        if tenure is None:
            return False
        # Step while a decision waits or a timer is due. An idle engine blocks on its input
        # queue; the push thread wakes it when either happens (tenure.engine_adapter.wakeup).
        return tenure.has_work(time.monotonic())

    def reset_cache(self) -> None:
        super().reset_cache()

    def shutdown(self) -> None:
        client = self.push_client
        if client is not None:
            client.stop()
            self.push_client = None
        super().shutdown()
