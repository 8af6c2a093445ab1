"""The sidecar's use of the harness profiles (:mod:`tenure.service.harness.profiles`).

Three rules, each from what a harness's own traffic says:

* **a sub-agent is its own session**: a Claude Code sub-agent (``x-claude-code-agent-id``)
  or a Codex sub-agent thread becomes the session the profile names, with ``parent`` = its
  lead, unless Tenure's own hints name the session; with segment tracking on, its first
  request is the spawn (the worker class, the ranker's record);
* **a one-shot run's final answer is its likely end** (``claude -p``, ``codex exec``), and a
  sub-agent's answer to its lead is its end: the decision is an inferred end
  (:func:`~tenure.service.policy.lifecycle.on_likely_end`): its KV goes first among the resident,
  but is not reclaimed, so ``--continue`` still hits what is left. Interactive entry points keep
  the human-gap prediction. Per tenant: ``TenantSpec.infer_run_end``;
* **a lead waiting for its foreground sub-agent** is not waiting for a human: when the
  child's first turn is counted, the lead's gap becomes the child's predicted lifetime
  (:func:`~tenure.service.policy.lifecycle.on_awaiting_child`), and when the child answers, the lead
  is due at once.

Fields that are malformed or come from a version outside a profile's trusted range change
nothing and are counted (``tenure_harness_fields_total``, labels from a fixed set).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tenure.service.api.hints.tenure import Hints
from tenure.service.harness.profiles import HarnessReading, read
from tenure.service.metrics import Metrics
from tenure.service.policy import lifecycle
from tenure.service.policy.gap import stop_class
from tenure.service.policy.lifecycle import LifecycleDecision

__all__ = ["HarnessRules", "likely_end"]


class HarnessRules:
    """Reads each tracked request's harness fields onto its hints, counting every field."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._counters: dict[tuple[str, str, str], Any] = {}

    def apply(
        self, hints: Hints, own: Hints, headers: Mapping[str, str], payload: Mapping[str, Any]
    ) -> tuple[Hints, HarnessReading]:
        """``hints`` (after the dialects) with the harness's session and parent; ``own`` is
        Tenure's own hints, which always win."""
        reading = read(headers, payload)
        for event in reading.events:
            counter = self._counters.get(event)
            if counter is None:
                counter = self._counters[event] = self._metrics.harness_fields.labels(*event)
            counter.inc()
        if own.session is not None or reading.session is None:
            return hints, reading
        if reading.parent is not None:
            # A sub-agent: its own session under its lead (the route's keys name the lead).
            parent = own.parent if own.parent is not None else reading.parent
            return dataclasses.replace(hints, session=reading.session, parent=parent), reading
        if hints.session is None:
            return dataclasses.replace(hints, session=reading.session), reading
        return hints, reading


def likely_end(
    reading: HarnessReading | None, stop_reason: str | None, now: float, *, enabled: bool
) -> LifecycleDecision | None:
    """The inferred end of a run whose turn just ended with ``stop_reason`` (None: none)."""
    if reading is None or not enabled or stop_class(stop_reason) != "human":
        return None
    if reading.subagent:
        # A sub-agent's answer goes to its lead, never to a person: it is done.
        return lifecycle.on_likely_end(now, reason=f"{lifecycle.LIKELY_END}_subagent")
    if reading.one_shot:
        return lifecycle.on_likely_end(now, reason=f"{lifecycle.LIKELY_END}_one_shot")
    return None
