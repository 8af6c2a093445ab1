"""What a policy may read of the tier that owns it: a narrow, read-only view.

A policy decides; the :class:`~tenure.service.policy.tier.HostTier` keeps the books and calls the
policy. The policy reads residency back through this protocol only, so ``base.py`` (the
contract) does not import ``tier.py`` (its one implementation) and a policy cannot mutate the
tier's books behind its back: every change goes through the tier's own methods.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from tenure.service.policy.types import Run

__all__ = ["TierView"]


class TierView(Protocol):
    """Read-only residency facts of one host tier (``HostTier`` implements it)."""

    @property
    def capacity(self) -> int | None:
        """Blocks the tier may hold (``None``: unbounded)."""
        ...

    @property
    def session_resident(self) -> Mapping[str, int]:
        """Resident blocks per session (sessions holding none may be absent)."""
        ...

    def owner(self, seg: int) -> str: ...

    def segments_of(self, session: str) -> Sequence[int]: ...

    def resident_blocks(self, seg: int) -> int: ...

    def resident_sessions(self) -> Iterator[tuple[str, int]]: ...

    def tail_runs(self, seg: int, n: int) -> list[Run]: ...

    def missing(self, runs: Sequence[Run]) -> list[Run]: ...

    def resident(self, runs: Sequence[Run]) -> list[Run]: ...
