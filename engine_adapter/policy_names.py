"""The names under which core policies are registered in vLLM: plain strings, no vLLM import.

Apart from :mod:`tenure.engine_adapter.policies` (which builds the classes and imports vLLM), so a
launcher that only writes an engine's command line (``tenure up``) need not import vLLM: that
import takes 5-13 s on a 2-core VM, on the same cores the engine it launches starts on.
"""

from __future__ import annotations

import re

__all__ = ["VLLM_BUILTINS", "class_name_for", "vllm_name_for"]

#: vLLM's built-in policy names; a core policy of the same name is registered with this prefix.
VLLM_BUILTINS = frozenset({"lru", "arc"})
_PREFIX = "tenure-"


def vllm_name_for(core_name: str) -> str:
    """The ``eviction_policy`` name under which ``core_name`` is selectable in vLLM."""
    return _PREFIX + core_name if core_name in VLLM_BUILTINS else core_name


def class_name_for(core_name: str) -> str:
    return "Tenure_" + re.sub(r"\W", "_", core_name)
