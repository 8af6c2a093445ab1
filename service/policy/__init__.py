"""Tenure's pure decision core: policies, host-tier bookkeeping, gap prediction, retention.

No I/O, no asyncio, no clock reads: time is always an argument. The replay simulator, the
sidecar and the engine adapter all call these classes.
"""

from tenure.service.policy.base import PolicyParams, TierPolicy
from tenure.service.policy.gap import GapPredictor, stop_class
from tenure.service.policy.registry import (
    UnknownPolicyError,
    create_policy,
    policy_class,
    policy_names,
    register_policy,
)
from tenure.service.policy.tier import HostTier
from tenure.service.policy.types import EvictionClass, Run, SessionHint, StoreResult, Victim

__all__ = [
    "EvictionClass",
    "GapPredictor",
    "HostTier",
    "PolicyParams",
    "Run",
    "SessionHint",
    "StoreResult",
    "TierPolicy",
    "UnknownPolicyError",
    "Victim",
    "create_policy",
    "policy_class",
    "policy_names",
    "register_policy",
    "stop_class",
]
