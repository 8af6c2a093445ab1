"""Online prediction of the idle gap before a session's next turn.

Agent gaps are bimodal and predictable from what the sidecar proxies: after a response that
stops for a tool call the next turn comes in seconds; after one that ends the turn a human
answers in minutes to hours. The predictor keeps a bounded window of observed gaps per stop class
(and per tool name when there are enough samples) and predicts their median, which is robust to
the heavy tail. Until a class has ``min_samples`` observations it falls back to a prior.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from statistics import median
from typing import Any

__all__ = ["DEFAULT_PRIOR_S", "GapPredictor", "stop_class"]

#: Priors before any observation: the medians the traces README reports for Claude Code
#: (tool-result gap 9 s, human-turn gap 127 s). Replaced by observations as they arrive.
DEFAULT_PRIOR_S: Mapping[str, float] = {"tool": 9.0, "human": 127.0, "other": 30.0}

# ``pause_turn`` (Anthropic): the server paused a long turn and the harness sends it straight
# back, as after a tool call. ``refusal`` ends the turn: a human reads it next.
_TOOL_STOPS = frozenset({"tool_use", "tool_calls", "function_call", "tool", "pause_turn"})
_HUMAN_STOPS = frozenset(
    {"end_turn", "stop", "stop_sequence", "human", "max_tokens", "length", "refusal"}
)


def stop_class(stop_reason: str | None) -> str:
    """Map an Anthropic or OpenAI stop/finish reason to ``tool``, ``human`` or ``other``."""
    if stop_reason in _TOOL_STOPS:
        return "tool"
    if stop_reason in _HUMAN_STOPS:
        return "human"
    return "other"


class GapPredictor:
    """Median of the recent gaps observed after each stop class (and tool name)."""

    def __init__(
        self,
        prior: Mapping[str, float] | None = None,
        window: int = 256,
        min_samples: int = 5,
    ) -> None:
        if window < 1 or min_samples < 1:
            raise ValueError("window and min_samples must be >= 1")
        self.prior = dict(DEFAULT_PRIOR_S if prior is None else prior)
        self.window = window
        self.min_samples = min_samples
        self._samples: dict[str, deque[float]] = {}
        self._cache: dict[str, float] = {}

    def observe(self, stop_reason: str | None, gap_s: float, tool: str | None = None) -> None:
        if gap_s < 0 or gap_s != gap_s:  # negative or NaN: a clock glitch, not a gap
            return
        cls = stop_class(stop_reason)
        keys = [cls] if tool is None else [cls, f"{cls}:{tool}"]
        for key in keys:
            samples = self._samples.get(key)
            if samples is None:
                samples = self._samples[key] = deque(maxlen=self.window)
            samples.append(float(gap_s))
            self._cache.pop(key, None)

    def predict(self, stop_reason: str | None, tool: str | None = None) -> float:
        cls = stop_class(stop_reason)
        if tool is not None:
            value = self._median(f"{cls}:{tool}")
            if value is not None:
                return value
        value = self._median(cls)
        if value is not None:
            return value
        return self.prior.get(cls, self.prior.get("other", 30.0))

    def samples(self, stop_reason: str | None) -> int:
        return len(self._samples.get(stop_class(stop_reason), ()))

    def _median(self, key: str) -> float | None:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        samples = self._samples.get(key)
        if samples is None or len(samples) < self.min_samples:
            return None
        value = float(median(samples))
        self._cache[key] = value
        return value

    def to_state(self) -> dict[str, Any]:
        return {
            "prior": dict(self.prior),
            "window": self.window,
            "min_samples": self.min_samples,
            "samples": {key: list(values) for key, values in self._samples.items()},
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> GapPredictor:
        predictor = cls(
            prior=state.get("prior"),
            window=int(state.get("window", 256)),
            min_samples=int(state.get("min_samples", 5)),
        )
        for key, values in dict(state.get("samples", {})).items():
            predictor._samples[str(key)] = deque(
                (float(v) for v in values), maxlen=predictor.window
            )
        return predictor
