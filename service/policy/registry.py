"""Policies by name: one module per policy, imported lazily, never an if/elif factory.

Out-of-tree policies register with :func:`register_policy`; an unknown name raises
:class:`UnknownPolicyError` listing the valid ones.
"""

from __future__ import annotations

from collections.abc import Mapping

from tenure.service.policy.base import PolicyParams, TierPolicy
from tenure.service.policy.targets import resolve_class

__all__ = [
    "UnknownPolicyError",
    "admission_policy_names",
    "create_policy",
    "policy_class",
    "policy_names",
    "register_policy",
]

_REGISTRY: dict[str, str] = {
    "notier": "tenure.service.policy.notier:NoTierPolicy",
    "infinite": "tenure.service.policy.notier:InfinitePolicy",
    "lru": "tenure.service.policy.lru:LRUPolicy",
    "lru-reclaim": "tenure.service.policy.lru:LRUReclaimPolicy",
    "arc": "tenure.service.policy.arc:ARCPolicy",
    "ttl": "tenure.service.policy.ttl:TTLPinPolicy",
    "marconi": "tenure.service.policy.marconi:MarconiPolicy",
    "mori": "tenure.service.policy.mori:MoriPolicy",
    "tenure": "tenure.service.policy.gate:TenureGate",
    "tenure-tags-off": "tenure.service.policy.gate:TenureTagsOff",
    "tenure-exact-gap": "tenure.service.policy.gate:TenureExactGap",
    "gate-only-literal": "tenure.service.policy.gate:GateOnlyLiteral",
    "tenure-density": "tenure.service.policy.density:TenureDensity",
    "tenure-density-exact-gap": "tenure.service.policy.density:TenureDensityExactGap",
    "oracle": "tenure.service.policy.oracle:OraclePolicy",
}


class UnknownPolicyError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(f"unknown policy {name!r}; valid: {', '.join(policy_names())}")
        self.name = name


def register_policy(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:ClassName"``) under ``name``; idempotent."""
    current = _REGISTRY.get(name)
    if current is not None and current != target:
        raise ValueError(f"policy {name!r} is already registered as {current}")
    _REGISTRY[name] = target


def policy_names() -> list[str]:
    return sorted(_REGISTRY)


def admission_policy_names() -> list[str]:
    """Registered policies that refuse stores by design (``TierPolicy.admission``)."""
    return [name for name in policy_names() if policy_class(name).admission]


def policy_class(name: str) -> type[TierPolicy]:
    target = _REGISTRY.get(name)
    if target is None:
        raise UnknownPolicyError(name)
    cls: type[TierPolicy] = resolve_class(target, TierPolicy)
    return cls


def create_policy(name: str, params: PolicyParams | None = None) -> TierPolicy:
    return policy_class(name)(params)


def default_params() -> Mapping[str, Mapping[str, float]]:
    return {name: dict(policy_class(name).defaults) for name in policy_names()}
