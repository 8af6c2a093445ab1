"""The policy contract: a narrow ABC every host-tier policy implements.

The :class:`~tenure.service.policy.tier.HostTier` owns the bookkeeping (which blocks are resident,
capacity, counters); a policy only *decides*. The contract mirrors vLLM's ``CachePolicy``
(``vllm/v1/kv_offload/cpu/policies/base.py``) one level up, on runs of blocks:

* ``select_victims`` is all-or-nothing: it returns victims covering exactly ``n`` blocks and
  forgets them, or returns ``None`` and changes nothing. Returning ``None`` is how a policy
  *refuses* the incoming store (the admission gate).
* Observation hooks (``on_insert``, ``on_access``, ``on_hint``) never evict.
* ``due`` returns blocks to drop now whatever the pressure (reclaim on a declared last turn, an
  expired TTL); ``next_timer`` says when ``due`` will next have work, so callers (the replay's
  event queue, the engine adapter's ``has_pending_work``) know when to call it.
* No I/O and no clock reads: ``now`` (seconds) is always an argument.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from typing import ClassVar, Literal

from tenure.service.policy.tier_view import TierView
from tenure.service.policy.types import EvictionClass, Run, SessionHint, Victim

__all__ = ["HintSource", "PolicyParams", "TierPolicy", "merge_runs"]

PolicyParams = Mapping[str, float]
HintSource = Literal["none", "predicted", "exact"]


class TierPolicy(ABC):
    """Decides which runs of blocks stay in one capacity-bounded host tier."""

    name: ClassVar[str] = ""
    #: Parameter defaults; every parameter a policy reads is listed here (explicit, sweepable).
    defaults: ClassVar[Mapping[str, float]] = {}
    #: Values the replay's parameter sweep tries, per parameter (the seed sweeps these).
    sweep: ClassVar[Mapping[str, Sequence[float]]] = {}
    #: Which lifecycle hints the caller feeds: ``"none"`` (tags-off and hint-blind baselines),
    #: ``"predicted"`` (online gap prediction + declared last turn, what a real harness gives),
    #: ``"exact"`` (the true next gap: the seed's replay and the clairvoyant reference).
    hint_source: ClassVar[HintSource] = "none"
    #: The policy learns gaps itself (:mod:`tenure.service.policy.gap_learner`): a caller that
    #: has no stop reason for a turn sends no gap rather than a stop-blind global median.
    learns_gaps: ClassVar[bool] = False
    #: The ``infinite`` reference: the tier ignores its capacity.
    unbounded: ClassVar[bool] = False
    #: The ``notier`` reference: the tier has no room at all, whatever it was given.
    no_capacity: ClassVar[bool] = False
    #: An admission policy: ``select_victims`` refuses stores by design (a gate), not only
    #: when it cannot free enough (the contract tests expect it to refuse under pressure).
    admission: ClassVar[bool] = False

    def __init__(self, params: PolicyParams | None = None) -> None:
        unknown = set(params or {}) - set(self.defaults)
        if unknown:
            raise ValueError(
                f"policy {self.name!r} has no parameter(s) {sorted(unknown)}; "
                f"valid: {sorted(self.defaults) or 'none'}"
            )
        self.params: dict[str, float] = {**self.defaults, **(params or {})}
        self.counters: Counter[str] = Counter()
        self._tier: TierView | None = None

    @property
    def tier(self) -> TierView:
        if self._tier is None:
            raise RuntimeError("policy is not attached to a HostTier")
        return self._tier

    def attach(self, tier: TierView) -> None:
        """Called once by the tier that owns this policy (gives read access to residency)."""
        self._tier = tier

    # --- observations: never evict ------------------------------------------------------

    def on_insert(self, run: Run, now: float) -> None:  # noqa: B027 - optional hook
        """Blocks of ``run`` were just admitted (in prefix order)."""

    def on_request_insert(self, request: Hashable, run: Run, now: float) -> None:
        """Blocks of ``run`` were just admitted for ``request`` (an opaque id, one per engine
        request). vLLM 0.33's stores are request-scoped; the default is :meth:`on_insert`."""
        self.on_insert(run, now)

    def on_request_access(  # noqa: B027
        self, request: Hashable, runs: Sequence[Run], now: float
    ) -> None:
        """``request`` used ``runs`` mid-flight (vLLM 0.33's ``on_request_access``: prefix order
        maintained before the request finishes, no access committed). Default: ignored."""

    def on_access(  # noqa: B027
        self, session: str, runs: Sequence[Run], inserted: Sequence[Run], now: float
    ) -> None:
        """``session``'s request finished having used ``runs`` (prefix order).

        vLLM's request-scoped access (``on_request_finished``); ``inserted`` are the runs this
        request stored itself (insertion-only, not a reuse), which ARC tells apart.
        """

    def on_touch(  # noqa: B027
        self, runs: Sequence[Run], pending: Sequence[Run], now: float
    ) -> None:
        """A direct recency signal for resident ``runs`` in the order given (vLLM's ``touch``).

        Not a request: no session starts or finishes. ``pending`` are the touched blocks whose
        store has not completed yet (vLLM's ARC keeps those in T1). Recency policies apply it;
        the default ignores it.
        """

    def on_lookup(self, session: str, blocks: int, hit: int, now: float) -> None:  # noqa: B027
        """A request of ``session`` was admitted after looking the tier up for ``blocks`` (its
        context from the GPU prefix hit on; 0 when the GPU holds it all), of which the first
        ``hit`` were resident (the prefix it loads). The replay and the engine adapter both
        report it, once per request, when the engine admits the request."""

    def on_refused(self, session: str, runs: Sequence[Run], now: float) -> None:  # noqa: B027
        """The tier refused ``session``'s offer of ``runs`` (after ``select_victims`` said no)."""

    def on_store_miss(self, runs: Sequence[Run], now: float) -> None:  # noqa: B027
        """Blocks about to be stored were missing (ARC learns from its ghost lists here)."""

    def on_remove(self, run: Run) -> None:  # noqa: B027
        """Blocks left the tier by a caller's decision (failed store, truncation, session drop)."""

    def on_hint(self, session: str, hint: SessionHint, now: float) -> None:  # noqa: B027
        """Lifecycle news about ``session`` (expected gap, last turn, suspension)."""

    def forget(self, session: str) -> None:  # noqa: B027
        """``session`` is gone and holds no blocks: drop everything kept about it."""

    def on_request_start(self, session: str, now: float) -> None:  # noqa: B027
        """A request of ``session`` arrived (it is active until its turn ends)."""

    def on_request_admitted(self, session: str, now: float) -> None:  # noqa: B027
        """The engine admitted ``session``'s request: its lookup is behind it, and from now
        on it loads or computes (between arrival and this it waits in the engine's queue)."""

    # --- decisions ------------------------------------------------------------------------

    @abstractmethod
    def select_victims(
        self, n: int, incoming: str | None, protected: Sequence[Run], now: float
    ) -> list[Victim] | None:
        """Free exactly ``n`` resident blocks for a store by ``incoming``, or refuse.

        ``protected`` runs (the offer itself) are never chosen. All-or-nothing: on ``None`` no
        state changed; otherwise the returned victims are already forgotten by the policy and the
        tier clears them.
        """

    def due(self, now: float) -> list[Victim]:
        """Blocks to drop now regardless of pressure (reclaim, expired TTL); forgotten on return."""
        return []

    def next_timer(self) -> float | None:
        """Earliest time at which :meth:`due` may return something, or ``None``."""
        return None

    def fingerprint(self) -> bytes:
        """Canonical bytes of the decision state (tests compare it: queries change nothing).

        Memo caches and the tier back-reference are left out; policies whose containers have
        several layouts for one state (a lazily cleaned heap) override this.
        """
        state = {k: v for k, v in vars(self).items() if k != "_tier" and "cache" not in k}
        return pickle.dumps(state)

    def snapshot_counters(self) -> dict[str, int]:
        return dict(self.counters)

    def _count_victims(self, victims: Sequence[Victim]) -> None:
        for victim in victims:
            self.counters[f"evicted_blocks_{victim.cls.value}"] += victim.run.blocks
        classes = {victim.cls for victim in victims}
        for cls in classes:
            self.counters[f"evictions_{cls.value}"] += 1


def merge_runs(blocks: Sequence[tuple[int, int]], cls: EvictionClass) -> list[Victim]:
    """Turn ``(seg, index)`` pairs into victims over maximal ascending runs (order kept: a
    descending pair stays two victims, so the blocks leave in the order they were chosen)."""
    victims: list[Victim] = []
    for seg, index in blocks:
        if victims:
            last = victims[-1].run
            if last.seg == seg and last.stop == index:
                victims[-1] = Victim(Run(seg, last.start, index + 1), cls)
                continue
        victims.append(Victim(Run(seg, index, index + 1), cls))
    return victims
