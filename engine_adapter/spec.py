"""``TenureOffloadingSpec``: vLLM's CPU offloading spec with Tenure's manager and push channel.

Select it with ``"spec_name": "TenureOffloadingSpec"`` (registered by the plugin, no module
path) and a Tenure policy with ``"eviction_policy": "tenure"``. Keys it reads from
``kv_connector_extra_config`` beside the stock ones:

* ``tenure_push_addr`` — the sidecar's push channel (``tcp://127.0.0.1:PORT`` or ``ipc://``);
  env ``TENURE_PUSH_ADDR`` when absent; no address = no channel (tags-off decisions only).
* ``tenure_policy_params`` — explicit core-policy parameters (e.g. ``{"overdue_slack_s": 10}``).
* ``tenure_report_interval_s`` / ``tenure_hello_interval_s`` — push-channel cadence.

The worker side is the stock one (CUDA / XPU); :mod:`tenure.engine_adapter.cpu_spec` swaps in a
host-copy worker for vLLM's CPU platform.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_offload.base import OffloadingManager
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from tenure.engine_adapter.manager import TenureOffloadingManager
from tenure.engine_adapter.policy import TenureCachePolicy
from tenure.engine_adapter.settings import ENGINE_ID_ENV, PUSH_ADDR_ENV, adapter_env
from tenure.engine_adapter.vllm_compat import set_spec_manager, spec_manager

if TYPE_CHECKING:
    from tenure.engine_adapter.push_client import PushClient

__all__ = ["ENGINE_ID_ENV", "PUSH_ADDR_ENV", "TenureOffloadingSpec"]

log = logging.getLogger("vllm.tenure")


def _float(extra: dict[str, Any], key: str, default: float) -> float:
    value = extra.get(key, default)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"kv_connector_extra_config.{key} must be a number, got {value!r}"
        ) from None


class TenureOffloadingSpec(CPUOffloadingSpec):
    """Stock CPU offloading spec whose scheduler side runs :class:`TenureOffloadingManager`."""

    def get_manager(self) -> OffloadingManager:
        cached: OffloadingManager | None = spec_manager(self)
        if cached is not None:
            return cached
        extra = dict(self.extra_config)
        store_threshold = int(extra.get("store_threshold", 0))
        block_tokens = self.tokens_per_block[0] * self.blocks_per_chunk
        env = adapter_env()
        addr = extra.get("tenure_push_addr") or env.push_addr
        push: Callable[[TenureCachePolicy], PushClient] | None = None
        if addr:
            # Imported only with a channel: an engine without one loads no ZeroMQ.
            from tenure.engine_adapter.push_client import engine_push_client
            from tenure.engine_adapter.wakeup import find_engine_waker

            def push(policy: TenureCachePolicy) -> PushClient:
                engine_id = extra.get("tenure_engine_id") or env.engine_id
                return engine_push_client(
                    self,
                    str(addr),
                    policy,
                    engine_id=str(engine_id or self.config.engine_id),
                    adapter_id=str(engine_id) if engine_id else None,
                    bytes_per_block=self.kv_bytes_per_chunk,
                    report_interval_s=_float(extra, "tenure_report_interval_s", 1.0),
                    hello_interval_s=_float(extra, "tenure_hello_interval_s", 15.0),
                    waker=find_engine_waker(),
                )

        manager = TenureOffloadingManager(
            num_chunks=self.num_chunks,
            cache_policy=self.eviction_policy,
            cache_policy_module_path=self.cache_policy_module_path,
            enable_events=self.kv_events_config.enable_kv_cache_events,
            store_threshold=store_threshold,
            max_tracker_size=int(extra.get("max_tracker_size", 64_000)),
            block_tokens=block_tokens,
            bytes_per_block=self.kv_bytes_per_chunk,
            policy_params=extra.get("tenure_policy_params"),
            push=push,
        )
        set_spec_manager(self, manager)
        return manager
