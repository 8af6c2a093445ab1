"""The state one :class:`~tenure.engine_adapter.policy.TenureCachePolicy` keeps, declared once.

The policy is one ``CachePolicy`` object built from parts with one job each, stacked from
this base up: the key <-> (segment, index) map (:mod:`tenure.engine_adapter.key_map`), the
application of pushed decisions and timers (:mod:`tenure.engine_adapter.pushed`), session inference
and request starts (:mod:`tenure.engine_adapter.requests`), the store-gating protocol
(:mod:`tenure.engine_adapter.store_gate`) and the calls that carry no decision of their own under
vLLM's stock manager (:mod:`tenure.engine_adapter.stock_path`). They share these fields (set by
``TenureCachePolicy._reset_state``): one object, so vLLM's hot calls stay plain attribute
reads with no hop between components.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from vllm.v1.kv_offload.base import OffloadKey, ReqContext
from vllm.v1.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus

from tenure.engine_adapter.rent_timers import RentTimers
from tenure.engine_adapter.resumes import ResumeTracker
from tenure.engine_adapter.tags import RequestTags
from tenure.service.policy import EvictionClass, HostTier, SessionHint, TierPolicy
from tenure.service.wire.push import Decision, Snapshot

__all__ = ["PolicyState", "RequestInfo"]

#: ``(segment, block index)``: where a key sits in the core's tier.
Loc = tuple[int, int]
#: Requests whose reported store misses the stock-manager path remembers.
RECENT_REQUESTS = 256


@dataclass(slots=True)
class RequestInfo:
    """Per-request state, cached in the request's ``ReqContext``.

    ``owner`` is the policy's generation token: a ``clear()`` (vLLM's ``reset_cache``) makes a
    new one, so state cached before it (segment ids of the old tier) is never trusted after.
    """

    owner: object
    tags: RequestTags
    session: str | None
    #: The request's id in the core (request-scoped ranks: vLLM 0.33's LRU).
    serial: int = 0
    seg: int = -1
    next_index: int = 0
    started: bool = False
    inserted: list[OffloadKey] = field(default_factory=list)
    #: The last offer the gate refused, as (new blocks, last new key): vLLM re-offers a
    #: refused range at every engine step, and a repeat is not counted as another refusal.
    refused_offer: tuple[int, OffloadKey] | None = None


class PolicyState(CachePolicy):
    """Fields shared by the policy's parts (see the module docstring)."""

    core_name: ClassVar[str]
    _clock: Callable[[], float]
    _wall_clock: Callable[[], float]
    _core_params: dict[str, float] | None
    can_release: bool
    block_tokens: int
    inbox: deque[Decision | Snapshot]
    stats: Counter[str]
    generation: int
    #: Resumed requests classified by where their prompt came from (reported upstream).
    resumes: ResumeTracker
    #: Tenants' rent clocks and the held copies they re-price (pushed decisions).
    rent_timers: RentTimers
    #: Tenant -> the host-retention branch of the sidecar's last snapshot.
    retention_branches: dict[str, str]
    _epoch: object
    core: TierPolicy
    tier: HostTier
    chunks: dict[OffloadKey, ChunkStatus]
    _loc: dict[OffloadKey, Loc]
    _key_at: list[list[OffloadKey | None]]
    _frontier: list[int]
    #: Base segment -> its fork segments (context edits, same-position KV groups).
    _forks: dict[int, list[int]]
    _fork_serial: int
    _pinned: set[OffloadKey]
    _doomed: dict[OffloadKey, EvictionClass]
    _staged: set[OffloadKey]
    _staged_victims: list[tuple[OffloadKey, EvictionClass]] | None
    #: Under vLLM's stock manager: the misses of an offer not decided yet (``on_store_miss``
    #: only sees the new misses; ``evict`` sees the whole offer, ``insert`` a store that
    #: needs no room), with the storing request.
    _stash: tuple[list[OffloadKey], ReqContext] | None
    #: Stock manager: recent requests' reported misses (key -> order), to find the request
    #: and the store behind a bare evict() when vLLM did not report (a retried offer).
    _misses: OrderedDict[int, tuple[ReqContext, dict[OffloadKey, None]]]
    _refused: bool
    _offer_blocks: int
    _polls: int
    _released: list[tuple[OffloadKey, ChunkStatus]]
    _sharers: dict[OffloadKey, dict[str, Loc]]
    _ended: set[str]
    _held: set[str]
    _applied_seq: dict[str, int]
    _last_hint: dict[str, SessionHint]
    _last_ctx: ReqContext | None
    _next_due: float
    last_applied_seq: int
    _request_serial: int

    # Defined by a part above the one that calls it (evict() asks the stock path for the
    # offer it did not see).
    def _stashed_offer(
        self, n: int, protected: set[OffloadKey]
    ) -> tuple[list[OffloadKey], ReqContext | None]:
        raise NotImplementedError
