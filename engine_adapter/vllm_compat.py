"""Every private vLLM name the adapter touches, in one place, with what it is for.

vLLM's offloading API (``CachePolicy``, ``OffloadingManager``, ``OffloadingSpec``) is public,
but a few facts the adapter needs are not exposed: they are reached here and nowhere else, so
an upgrade that moves one breaks this module (and ``tests/engine/test_vllm_compat.py``, which
imports each name on the installed vLLM and says which one moved), not the adapter's logic.

Per name, :data:`PRIVATE_NAMES` says where it lives, the vLLM releases it was checked on, and
what breaks without it. The accessors below are the only code that spells the names; the
adapter calls them (the hot ones are plain attribute reads, inlined by the callers' locals).
"""

from __future__ import annotations

import queue
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadKey, ReqContext

__all__ = [
    "PRIVATE_NAMES",
    "SUPPORTED",
    "PrivateName",
    "UnsupportedVllmError",
    "add_evictable_chunks",
    "cache_policy_loader",
    "check_supported",
    "core_params",
    "engine_core_input_queue",
    "engine_id",
    "free_chunk",
    "is_loader_of",
    "manager_policy",
    "num_evictable_chunks",
    "num_free_chunks",
    "offload_key_positions",
    "reported_store_misses",
    "request_ranked_lru",
    "set_spec_manager",
    "spec_manager",
    "vllm_release",
    "wake_message",
]

#: Releases each name below was checked on (the installed build; 0.33.0 from its wheel's
#: pure-Python modules, see ``scripts/vllm_policy_tests_newest.sh``).
CHECKED_ON = ("0.32.0", "0.33.0")
#: The vLLM minor releases the adapter supports (``major.minor``; any patch release of them).
SUPPORTED: tuple[tuple[int, int], ...] = ((0, 32), (0, 33))


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is outside :data:`SUPPORTED`."""


def vllm_release(version: str | None = None) -> tuple[int, int]:
    """``(major, minor)`` of ``version`` (default: the installed vLLM's)."""
    if version is None:
        import vllm

        version = str(vllm.__version__)
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise UnsupportedVllmError(
            f"Tenure's engine adapter cannot read vLLM's version {version!r}; "
            f"it supports vLLM {_supported_range()}"
        ) from None


def _supported_range() -> str:
    low, high = SUPPORTED[0], SUPPORTED[-1]
    return f"{low[0]}.{low[1]}.x to {high[0]}.{high[1]}.x"


def check_supported(version: str | None = None) -> tuple[int, int]:
    """The installed (or given) vLLM release, or :class:`UnsupportedVllmError` naming the
    supported range: the offloading API the adapter implements changes between releases
    (0.33: ``insert(key, chunk, req_context)``, ``on_request_access``, request-ranked LRU)."""
    release = vllm_release(version)
    if release not in SUPPORTED:
        shown = version if version is not None else ".".join(map(str, release))
        raise UnsupportedVllmError(
            f"Tenure's engine adapter supports vLLM {_supported_range()}; this is vLLM "
            f"{shown}. Install a supported vLLM (pip install 'vllm>=0.32,<0.34') or a Tenure "
            "release that supports this one."
        )
    return release


def request_ranked_lru() -> bool:
    """vLLM 0.33's ``LRUCachePolicy`` ranks a request once, its blocks tail first; 0.32 ranks
    every stored block on its own (``tenure.service.policy.lru``'s ``request_ranks``)."""
    return check_supported() >= (0, 33)


def core_params(core_name: str, params: dict[str, float] | None) -> dict[str, float] | None:
    """``params`` for core policy ``core_name`` in lockstep with the installed vLLM: core
    policies with a ``request_ranks`` parameter (``lru``, ``lru-reclaim``) get the installed
    release's LRU semantics unless set explicitly."""
    from tenure.service.policy import policy_class

    if "request_ranks" not in policy_class(core_name).defaults:
        return params
    out = dict(params or {})
    out.setdefault("request_ranks", 1.0 if request_ranked_lru() else 0.0)
    return out


@dataclass(frozen=True, slots=True)
class PrivateName:
    """One private vLLM name: ``owner`` is ``module:Class`` (or ``module`` for a function)."""

    owner: str
    name: str
    #: ``field``: a dataclass field; ``attr``: set on instances (``self.<name> =`` in the
    #: class's source); ``class_attr``: on the class object; ``method``; ``function`` (of
    #: ``owner``'s module, or of ``sys`` for a stack walk).
    kind: Literal["field", "attr", "class_attr", "method", "function"]
    checked_on: tuple[str, ...]
    breaks: str


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "vllm.v1.kv_offload.base:ReqContext",
        "_offload_key_positions",
        "field",
        CHECKED_ON,
        "block positions of a request's keys: the key -> (segment, index) map, session "
        "inference of untagged requests and the stock manager's store order; without it "
        "every key takes the next index (runs still form, forks and inference stop working)",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.policies.factory:CachePolicyFactory",
        "_registry",
        "class_attr",
        CHECKED_ON,
        "telling our own earlier registration from a vLLM built-in of the same name "
        "(plugin.register warns only for the latter); without it the warning is always given",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager",
        "_policy",
        "attr",
        CHECKED_ON,
        "the manager's CachePolicy instance: the Tenure manager drives its own policy's store "
        "gate, frees and timers; without it the manager falls back to vLLM's stock behaviour",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager",
        "_num_evictable_cache_chunks",
        "attr",
        CHECKED_ON,
        "the manager's count of idle chunks: kept right when the policy frees chunks outside "
        "evict() (reclaim, TTL, pushed decisions) and read to skip stores vLLM will refuse",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager",
        "_free_chunk",
        "method",
        CHECKED_ON,
        "returning a chunk the policy released outside evict() to the free pool; without it "
        "out-of-band frees (reclaim, TTL) cannot happen",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager",
        "_get_num_free_chunks",
        "method",
        CHECKED_ON,
        "free room before a store: how many victims the gate must find",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.manager:CPUOffloadingManager",
        "_get_request_cache_access",
        "method",
        CHECKED_ON,
        "the store misses vLLM already reported for a request (ARC learns from each once)",
    ),
    PrivateName(
        "vllm.v1.kv_offload.cpu.spec:CPUOffloadingSpec",
        "_manager",
        "attr",
        CHECKED_ON,
        "the spec's cached scheduler-side manager: get_manager() returns one manager per spec "
        "as the stock spec does",
    ),
    PrivateName(
        "vllm.v1.kv_offload.tiering.spec:TieringOffloadingSpec",
        "_engine_id",
        "attr",
        CHECKED_ON,
        "names the shared host region of the CPU tiering spec's worker (the scheduler side "
        "maps the same region by it)",
    ),
    PrivateName(
        "sys",
        "_getframe",
        "function",
        CHECKED_ON,
        "the stack walk that finds the EngineCore under construction (its input_queue) so "
        "the push thread can wake an idle engine; without it pushed decisions and timers wait "
        "for the next engine step",
    ),
)


# --- requests -------------------------------------------------------------------------------


def offload_key_positions(ctx: ReqContext | None) -> dict[OffloadKey, int]:
    """``key -> end token`` of the request's offloaded keys (empty when unknown)."""
    positions: dict[OffloadKey, int] | None = getattr(ctx, "_offload_key_positions", None)
    return positions if positions is not None else {}


# --- cache-policy registry ------------------------------------------------------------------


def cache_policy_loader(factory: Any, name: str) -> object:
    """The loader vLLM's ``CachePolicyFactory`` holds for ``name`` (``None``: none)."""
    registry: dict[str, object] = getattr(factory, "_registry", {})
    return registry.get(name)


def is_loader_of(loader: object, module: str) -> bool:
    """Whether ``loader`` (a lazy-import closure of the factory) imports from ``module``."""
    cells = getattr(loader, "__closure__", None) or ()
    return any(getattr(cell, "cell_contents", None) == module for cell in cells)


# --- the CPU offloading manager -------------------------------------------------------------


def manager_policy(manager: Any) -> Any:
    return manager._policy


def num_evictable_chunks(manager: Any) -> int:
    return int(manager._num_evictable_cache_chunks)


def add_evictable_chunks(manager: Any, delta: int) -> None:
    manager._num_evictable_cache_chunks += delta


def free_chunk(manager: Any, chunk: Any) -> None:
    manager._free_chunk(chunk)


def num_free_chunks(manager: Any) -> int:
    return int(manager._get_num_free_chunks())


def reported_store_misses(manager: Any, ctx: ReqContext) -> Any:
    """The store-miss keys vLLM's manager already reported to its policy for ``ctx``."""
    return manager._get_request_cache_access(ctx).store_miss_keys


# --- specs ----------------------------------------------------------------------------------


def spec_manager(spec: Any) -> Any:
    return spec._manager


def set_spec_manager(spec: Any, manager: Any) -> None:
    spec._manager = manager


def engine_id(spec: Any) -> Any:
    return spec._engine_id


# --- the engine loop ------------------------------------------------------------------------


def engine_core_input_queue(depth: int = 1, max_frames: int = 64) -> queue.Queue[Any] | None:
    """The input queue of the EngineCore whose construction is on the caller's stack.

    ``depth`` frames above this call are skipped. ``None`` when no frame's ``self`` is an
    EngineCore with a ``queue.Queue`` input (an in-process engine, another vLLM layout).
    """
    frame: Any = sys._getframe(depth + 1)
    for _ in range(max_frames):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        inbox = getattr(owner, "input_queue", None)
        if isinstance(inbox, queue.Queue) and any(
            cls.__name__.startswith("EngineCore") for cls in type(owner).__mro__
        ):
            return inbox
        frame = frame.f_back
    return None


def wake_message() -> tuple[Any, None] | None:
    """The message that wakes an idle EngineCore's loop (vLLM's own shutdown wake-up)."""
    try:
        from vllm.v1.engine import EngineCoreRequestType
    except ImportError:  # pragma: no cover - a vLLM without the request type
        return None
    return (EngineCoreRequestType.WAKEUP, None)
