"""The ``vllm.general_plugins`` entry point: makes Tenure selectable by name in vLLM.

vLLM calls :func:`register` once in every process it starts (API server, EngineCore, workers),
possibly more than once per process; registration is therefore idempotent and imports only the
two factories (the policy and spec modules load lazily, when vLLM asks for them by name).

After it runs, ``kv_connector_extra_config`` accepts, with no module paths:

* ``"eviction_policy"``: ``"tenure"`` and every other core policy (``policy_names()``), the ones
  clashing with vLLM's built-ins as ``"tenure-lru"`` / ``"tenure-arc"``;
* ``"spec_name"``: ``"TenureOffloadingSpec"`` (GPU hosts: stock worker, Tenure's manager),
  ``"TenureCPUOffloadingSpec"`` (vLLM's CPU platform) and ``"CPUHostOffloadingSpec"`` (the stock
  manager on the CPU platform, for baselines), ``"TenureCPUTieringSpec"`` (vLLM's tiering spec,
  DRAM + secondary tiers, on the CPU platform);
* ``secondary_tiers`` entries of ``"type": "tenure-fs"`` (the ``fs`` SSD tier with Tenure's
  segment-aware store admission, deletion and wear accounting,
  :mod:`tenure.engine_adapter.tiering`).
"""

from __future__ import annotations

import contextlib
import logging

__all__ = ["SPECS", "TIERS", "register", "registered_policy_names"]

log = logging.getLogger("vllm.tenure")

SPECS: dict[str, tuple[str, str]] = {
    "TenureOffloadingSpec": ("tenure.engine_adapter.spec", "TenureOffloadingSpec"),
    "TenureCPUOffloadingSpec": ("tenure.engine_adapter.cpu_spec", "TenureCPUOffloadingSpec"),
    "CPUHostOffloadingSpec": ("tenure.engine_adapter.cpu_spec", "CPUHostOffloadingSpec"),
    "TenureCPUTieringSpec": ("tenure.engine_adapter.tiering_spec", "TenureCPUTieringSpec"),
}
#: Secondary tier types for ``TieringOffloadingSpec``'s ``secondary_tiers``.
TIERS: dict[str, tuple[str, str]] = {
    "tenure-fs": ("tenure.engine_adapter.tiering", "TenureFsTier"),
}


def registered_policy_names() -> dict[str, str]:
    """vLLM ``eviction_policy`` name -> core policy name, for every core policy."""
    from tenure.engine_adapter.policies import vllm_name_for
    from tenure.service.policy import policy_names

    return {vllm_name_for(name): name for name in policy_names()}


def register() -> None:
    from tenure.engine_adapter.vllm_compat import cache_policy_loader, check_supported, is_loader_of

    # Another vLLM release: one error naming the supported range, before any registration.
    check_supported()
    from vllm.v1.kv_offload.cpu.policies.factory import CachePolicyFactory
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    from tenure.engine_adapter.policies import class_name_for

    for vllm_name, core_name in registered_policy_names().items():
        try:
            CachePolicyFactory.register_cache_policy(
                vllm_name, "tenure.engine_adapter.policies", class_name_for(core_name)
            )
        except ValueError:
            # Already registered: by an earlier call in this process (fine), or a vLLM
            # built-in of the same name appeared (then vLLM's wins; say so once).
            loader = cache_policy_loader(CachePolicyFactory, vllm_name)
            if not is_loader_of(loader, "tenure.engine_adapter.policies"):
                log.warning("tenure: vLLM already has a cache policy %r; not overriding", vllm_name)
    for spec_name, (module, cls) in SPECS.items():
        with contextlib.suppress(ValueError):
            OffloadingSpecFactory.register_spec(spec_name, module, cls)
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    for tier_type, (module, cls) in TIERS.items():
        with contextlib.suppress(ValueError):
            SecondaryTierFactory.register_tier(tier_type, module, cls)
