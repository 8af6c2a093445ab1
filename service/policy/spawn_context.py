"""What a spawn knows of its parent: the one derivation the replay and the sidecar share.

The worker ranker's parent-side features (:class:`~tenure.service.policy.ranker.SpawnRecord`) are
derived here once, from two small facts both sides observe:

* :class:`ParentCall`, the parent's latest call before the spawn (the call whose tool use
  spawned the worker): its 0-based index, prompt and output size, whether it reasoned,
  whether it answered a human message (:func:`human_turn`), and the gap before it (the tool
  run or the human's wait: the previous call's end to this call's start);
* :class:`WorkerHistory`, the parent's earlier workers: how many, how many had returned, and
  the sum of their log lifetimes (a geometric mean needs only the sum and the count, so the
  sidecar keeps three counters per parent instead of a list).

The replay reads them from a trace (:mod:`tenure.service.replay.loaders.claude_code_meta`: ``in``,
``out``, ``output_types``, ``input_types``, ``think_time``, each sub-agent's ``t`` and
lifetime); the sidecar from what it proxies (:mod:`tenure.service.api.segments.tracker`: the
response's usage and reasoning, the request's last messages, its own clock, counters in Redis).
Pure: no I/O, no clock reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LIFETIME_FLOOR_S",
    "ParentCall",
    "WorkerHistory",
    "history_at",
    "human_turn",
    "input_types",
    "lifetime_log",
    "parent_features",
]

#: A lifetime below this counts as this in the geometric mean (a zero would be ``-inf``).
LIFETIME_FLOOR_S = 1e-3


@dataclass(frozen=True, slots=True)
class ParentCall:
    """The parent's latest call before a spawn."""

    index: int = 0  # 0-based: the parent's first call is 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    thinking: bool = False
    human_turn: bool = False
    gap_s: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkerHistory:
    """A parent's workers spawned before this one, and those of them that had returned."""

    before: int = 0
    returned: int = 0
    log_lifetime_sum: float = 0.0  # sum of lifetime_log() over the returned ones

    @property
    def returned_mean_lifetime_s(self) -> float:
        """The geometric mean lifetime of the returned workers; 0 when none had."""
        if self.returned <= 0:
            return 0.0
        return math.exp(self.log_lifetime_sum / self.returned)


def lifetime_log(lifetime_s: float) -> float:
    """One returned worker's contribution to :attr:`WorkerHistory.log_lifetime_sum`."""
    return math.log(max(lifetime_s, LIFETIME_FLOOR_S))


def history_at(earlier: Iterable[tuple[float, float]], at: float) -> WorkerHistory:
    """The history at time ``at`` of workers given as ``(spawned at, lifetime)``: a worker has
    returned when ``spawned + lifetime <= at`` (the replay's view, with every lifetime known)."""
    before, returned, total = 0, 0, 0.0
    for spawned, life in earlier:
        before += 1
        if spawned + life <= at:
            returned += 1
            total += lifetime_log(life)
    return WorkerHistory(before, returned, total)


def human_turn(types: Iterable[str]) -> bool:
    """Whether a call answered a human message: its new input has text (the trace's
    ``input_types`` containing ``text``), not only tool results."""
    return "text" in tuple(types)


def input_types(messages: Sequence[Any] | None) -> tuple[str, ...]:
    """The kinds of a chat request's new input, as the trace's ``input_types`` names them:
    what follows the last assistant message. An OpenAI ``tool`` message or an Anthropic
    ``tool_result`` block is ``tool_result``; a user message's text (a string, or ``text``
    parts) is ``text``; sorted, each kind once. Malformed entries are skipped."""
    if not messages:
        return ()
    tail: list[Any] = []
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant":
            break
        tail.append(message)
    kinds: set[str] = set()
    for message in tail:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role in ("tool", "function"):
            kinds.add("tool_result")
            continue
        if role != "user":
            continue
        if isinstance(content, str):
            if content.strip():
                kinds.add("text")
            continue
        for part in content if isinstance(content, list) else ():
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and str(part.get("text") or "").strip():
                kinds.add("text")
            elif kind == "tool_result":
                kinds.add("tool_result")
    return tuple(sorted(kinds))


def parent_features(call: ParentCall | None, history: WorkerHistory) -> dict[str, Any]:
    """The :class:`~tenure.service.policy.ranker.SpawnRecord` fields a spawn takes from its parent
    (names as the record's; ``None``: the parent has made no call yet)."""
    c = call if call is not None else ParentCall()
    return {
        "parent_turn": max(0, c.index),
        # The parent's context after its call: what it was sent plus what it wrote.
        "parent_context_tokens": max(0, c.prompt_tokens) + max(0, c.output_tokens),
        "parent_output_tokens": max(0, c.output_tokens),
        "parent_thinking": c.thinking,
        "parent_human_turn": c.human_turn,
        "parent_gap_s": max(0.0, c.gap_s),
        "workers_before": history.before,
        "workers_returned": history.returned,
        "returned_mean_lifetime_s": history.returned_mean_lifetime_s,
    }
