"""A dispatch plan and the rule that holds calls to it: one rule for the live gate and the
simulator (issue 28).

``tenure up`` sends every live call in the order a simulated run of its slice sent them, each
once the calls that run had finished before it have finished (:class:`DispatchPlan`); side by
side, one gate serves both arms and a call goes out in both at the same moment. Held to that
rule, a live arm no longer runs its own closed loop: side by side, the arm whose calls finish
sooner waits for the slower one, so its engine sees the other arm's overlap of calls. The
simulator models exactly that when it plays its arms under the same :class:`GateRule`
(:func:`tenure.service.replay.engine.simulate_paced`), where a simulated arm run freely
computed ~12% fewer prompt tokens than its live twin held to the plan.

The rule is pure state: the live :class:`~tenure.service.live.dispatch.Gate` parks asyncio
callers on it, the simulator asks it at each event of its clock.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DispatchPlan", "GateRule"]

Key = tuple[int, int]


@dataclass(frozen=True, slots=True)
class DispatchPlan:
    """The order in which a simulated run of the slice sent its calls, and what had finished
    before each. The live arms send theirs in that order, each only once the calls the
    simulated engine had finished before it have finished live (:class:`GateRule`): the GPU
    prefix cache's hits, the pool's contention and the host tier's traffic then follow one
    interleaving in both arms however fast the engine runs on a shared machine (a slower
    engine only stretches the run; a faster one can still overlap fewer calls)."""

    #: ``(session, turn)`` of every call, in the order they were sent.
    sent: tuple[Key, ...]
    #: ``(session, turn)`` of every call, in the order they finished.
    finished: tuple[Key, ...]
    #: Per call: how many of ``finished`` (a prefix) had finished when it was sent.
    finished_before: dict[Key, int]

    def rank(self) -> dict[Key, int]:
        return {key: i for i, key in enumerate(self.sent)}


class GateRule:
    """When a call may go: every call before it in the plan's order gone, every call the plan
    had finished before it finished, and the call due, in every one of ``arms`` arms.

    A call counts as gone once every arm has let it go and as finished once it finished in
    every arm, so with two arms neither runs ahead of the other. Callers report a call due
    (:meth:`arrive`), let it go when :meth:`ready` (:meth:`leave`, then :meth:`passed`), and
    report it finished (:meth:`done`); a caller that gives up waiting calls :meth:`leave`
    and :meth:`passed` all the same, so the others are not held by it."""

    __slots__ = ("_arms", "_arrived", "_before", "_done", "_finished", "_next", "_passed",
                 "_prefix", "_rank", "_sent")  # fmt: skip

    def __init__(self, plan: DispatchPlan, arms: int = 1) -> None:
        if arms < 1:
            raise ValueError("arms must be >= 1")
        self._rank = plan.rank()
        self._sent = plan.sent
        self._finished = plan.finished
        self._before = plan.finished_before
        self._arms = arms
        self._next = 0
        self._arrived: dict[Key, int] = {}
        self._passed: dict[Key, int] = {}
        self._done: dict[Key, int] = {}
        self._prefix = 0

    def knows(self, key: Key) -> bool:
        return key in self._rank

    def head(self) -> Key | None:
        """The first call in the plan's order that some arm has not let go yet."""
        return self._sent[self._next] if self._next < len(self._sent) else None

    def arrive(self, key: Key) -> None:
        self._arrived[key] = self._arrived.get(key, 0) + 1

    def leave(self, key: Key) -> None:
        self._arrived[key] -= 1

    def ready(self, key: Key) -> bool:
        return (
            self._next >= self._rank[key]
            and self._prefix >= self._before[key]
            and self._arrived.get(key, 0) + self._passed.get(key, 0) >= self._arms
        )

    def passed(self, key: Key) -> None:
        passed = self._passed[key] = self._passed.get(key, 0) + 1
        if passed >= self._arms:
            self._next = max(self._next, self._rank[key] + 1)

    def done(self, key: Key) -> None:
        self._done[key] = self._done.get(key, 0) + 1
        finished = self._finished
        while (
            self._prefix < len(finished) and self._done.get(finished[self._prefix], 0) >= self._arms
        ):
            self._prefix += 1
