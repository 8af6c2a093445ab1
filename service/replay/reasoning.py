"""Reasoning tokens per call, estimated from a trace that records only *whether* a call reasoned.

The Claude Code trace marks a call that emitted reasoning (``output_types`` contains
``thinking``) but records one output-token count for everything the call emitted. The estimate:
a reasoning call's visible output (its other ``output_types``: ``text``, ``tool_use``) is as long
as the median output of the calls that emitted the same visible kinds *without* reasoning, and
the rest of its output is reasoning::

    reasoning_k = max(0, out_k - median(out | same visible output types, no thinking))

(a call whose kinds never occur without reasoning falls back to the median over all
non-reasoning calls). The estimate is unbiased only if reasoning does not change how long the
visible part is; it is reported beside every result that uses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from statistics import median

from tenure.service.replay.loaders.claude_code_meta import TraceMeta

__all__ = ["ReasoningEstimate", "estimate_reasoning"]


@dataclass(frozen=True, slots=True)
class ReasoningEstimate:
    #: Session id -> estimated reasoning tokens of each of its calls (0 without reasoning).
    tokens: Mapping[str, tuple[int, ...]]
    #: Visible output kinds -> the median output tokens of non-reasoning calls emitting them.
    visible_median: Mapping[str, float]
    calls: int
    reasoning_calls: int
    reasoning_tokens: int
    output_tokens_of_reasoning_calls: int

    def summary(self) -> dict[str, object]:
        share = (
            self.reasoning_tokens / self.output_tokens_of_reasoning_calls
            if self.output_tokens_of_reasoning_calls
            else 0.0
        )
        return {
            "method": "reasoning = output - median output of non-reasoning calls with the same "
            "visible output types (text / tool_use), floored at 0",
            "calls": self.calls,
            "reasoning_calls": self.reasoning_calls,
            "reasoning_tokens": self.reasoning_tokens,
            "mean_reasoning_tokens_per_reasoning_call": (
                self.reasoning_tokens / self.reasoning_calls if self.reasoning_calls else 0.0
            ),
            "reasoning_share_of_reasoning_calls_output": share,
            "visible_output_median_tokens": dict(self.visible_median),
        }


def _kinds(types: tuple[str, ...]) -> str:
    return "+".join(types) or "none"


def estimate_reasoning(meta: TraceMeta) -> ReasoningEstimate:
    plain: dict[str, list[int]] = {}
    everything: list[int] = []
    for calls in meta.calls.values():
        for c in calls:
            if not c.thinking:
                plain.setdefault(_kinds(c.visible_types), []).append(c.output_tokens)
                everything.append(c.output_tokens)
    medians = {k: float(median(v)) for k, v in sorted(plain.items())}
    fallback = float(median(everything)) if everything else 0.0
    tokens: dict[str, tuple[int, ...]] = {}
    n_calls = n_reasoning = total = out_total = 0
    for sid, calls in meta.calls.items():
        per: list[int] = []
        for c in calls:
            n_calls += 1
            if not c.thinking:
                per.append(0)
                continue
            visible = medians.get(_kinds(c.visible_types), fallback)
            r = max(0, round(c.output_tokens - visible))
            per.append(r)
            n_reasoning += 1
            total += r
            out_total += c.output_tokens
        tokens[sid] = tuple(per)
    return ReasoningEstimate(tokens, medians, n_calls, n_reasoning, total, out_total)
