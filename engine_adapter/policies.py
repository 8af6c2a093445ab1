"""One ``CachePolicy`` class per core policy, resolvable by ``CachePolicyFactory`` by name.

vLLM instantiates a registered policy as ``cls(cache_capacity=n)`` with no room for a policy
name, so each core policy gets its own subclass of :class:`TenureCachePolicy`, created on first
use through this module's ``__getattr__`` (the factory calls ``getattr(module, class_name)``).
"""

from __future__ import annotations

from functools import cache

from tenure.engine_adapter.policy import TenureCachePolicy
from tenure.engine_adapter.policy_names import VLLM_BUILTINS, class_name_for, vllm_name_for

__all__ = ["VLLM_BUILTINS", "class_name_for", "policy_class_for", "vllm_name_for"]


@cache
def policy_class_for(core_name: str) -> type[TenureCachePolicy]:
    name = class_name_for(core_name)
    namespace = {"core_name": core_name, "__module__": __name__, "__qualname__": name}
    return type(name, (TenureCachePolicy,), namespace)


def __getattr__(name: str) -> type[TenureCachePolicy]:
    from tenure.service.policy import policy_names

    for core_name in policy_names():
        if class_name_for(core_name) == name:
            return policy_class_for(core_name)
    raise AttributeError(name)
