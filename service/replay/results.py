"""What a replay run records: per-turn arrays in completion order, and the run's totals."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tenure.service.replay.requests import Request

__all__ = ["RunResult", "time_weighted_p95"]


@dataclass(slots=True)
class RunResult:
    """Raw outcome of one run: per-turn arrays (completion order) and run totals."""

    policy: str
    seed: int
    turn_root: array[int] = field(default_factory=lambda: array("q"))
    turn_session: array[int] = field(default_factory=lambda: array("q"))
    turn_index: array[int] = field(default_factory=lambda: array("q"))
    ttft_s: array[float] = field(default_factory=lambda: array("d"))
    jct_s: array[float] = field(default_factory=lambda: array("d"))
    #: When each turn arrived at the engine (sent, on the simulated clock).
    arrival_s: array[float] = field(default_factory=lambda: array("d"))
    host_hit_tokens: array[int] = field(default_factory=lambda: array("q"))
    reusable_tokens: array[int] = field(default_factory=lambda: array("q"))
    prefill_tokens: array[int] = field(default_factory=lambda: array("q"))
    gpu_hit_tokens: array[int] = field(default_factory=lambda: array("q"))
    first_arrival_s: float = 0.0
    last_completion_s: float = 0.0
    host_bytes_stored: float = 0.0
    host_bytes_loaded: float = 0.0
    host_capacity_blocks: int = 0
    gpu_capacity_blocks: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    p95_live_sessions: float = 0.0
    p95_live_working_set_gib: float = 0.0
    sessions_skipped_oversize: int = 0
    sessions_run: int = 0
    #: Prefill work (FLOPs) the host tier's hits saved, and the bound on it for this run's
    #: access sequence (:mod:`tenure.service.replay.bound`); ``bound_work`` is NaN when not
    #: computed.
    saved_work: float = 0.0
    bound_work: float = float("nan")
    bound_seconds: float = 0.0
    #: The tighter bound for an engine that stores during the prefill (``prefill_stores``):
    #: at most ``bound_work``; NaN when not computed.
    bound_prefill_work: float = float("nan")
    #: The diagnostics (``ReplayConfig.bound_held``): blocks held across GPU-served uses, and
    #: blocks available only from vLLM's offers (NaN unless asked for).
    bound_held_work: float = float("nan")
    bound_vllm_work: float = float("nan")
    bound_intervals: int = 0
    #: The SSD tier's report (:meth:`tenure.service.replay.tiering.LowerTier.report`), when
    #: modelled.
    tiering: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return len(self.jct_s)

    def record(self, root: int, req: Request, seen_blocks: int, now: float, bt: int) -> None:
        """One completed turn (``bt``: tokens per block)."""
        self.turn_root.append(root)
        self.turn_session.append(req.session)
        self.turn_index.append(req.turn)
        self.ttft_s.append(req.first_token - req.arrival)
        self.jct_s.append(now - req.arrival)
        self.arrival_s.append(req.arrival)
        self.host_hit_tokens.append(req.host_hit * bt)
        self.reusable_tokens.append(max(0, seen_blocks - req.gpu_hit) * bt)
        self.prefill_tokens.append(req.prefilled)
        self.gpu_hit_tokens.append(req.gpu_hit * bt)
        self.last_completion_s = max(self.last_completion_s, now)


def time_weighted_p95(samples: Sequence[tuple[float, int, int]]) -> tuple[float, float]:
    """95th percentiles over time of a step function given as ``(time, value_a, value_b)``."""
    if len(samples) < 2:
        return (float(samples[0][1]), float(samples[0][2])) if samples else (0.0, 0.0)
    out: list[float] = []
    for col in (1, 2):
        spans: list[tuple[int, float]] = []
        for (t0, *vals), (t1, *_rest) in itertools.pairwise(samples):
            if t1 > t0:
                spans.append((vals[col - 1], t1 - t0))
        if not spans:
            out.append(float(samples[-1][col]))
            continue
        spans.sort()
        total = sum(d for _v, d in spans)
        acc = 0.0
        value = float(spans[-1][0])
        for v, d in spans:
            acc += d
            if acc >= 0.95 * total:
                value = float(v)
                break
        out.append(value)
    return out[0], out[1]
