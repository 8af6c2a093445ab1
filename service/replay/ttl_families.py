"""Approval-wait families for the host-TTL replay (seed 002, 4.1), each scaled to mean W_ref.

* ``lognormal``: sigma 1;
* ``exponential``;
* ``mixture``: short approvals (exponential, mean 60 s, weight 0.5) and long waits (lognormal,
  sigma 0.7, mean 3,540 s), mean 1,800 s as given, rescaled to ``W_ref`` like the others;
* ``claude-code``: the real human-turn gaps of the Claude Code trace (``think_time`` before a
  call whose input is a human ``text`` turn), resampled with replacement and scaled by one
  factor, ``W_ref`` over the mean of all the gaps, so that "2 x lambda_crit" is the same load
  as for the others. The sessions are split in two halves by a hash of their id: calibration
  samples come from one, held-out samples from the other, so calibration never sees a
  held-out gap. Both halves are in the same time unit, as a deployment's past and future
  waits are both in seconds (:meth:`EmpiricalWaits.family`).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tenure.service.errors import TraceError
from tenure.service.replay.loaders._io import json_lines

__all__ = [
    "FAMILY_NAMES",
    "SYNTHETIC_FAMILIES",
    "EmpiricalWaits",
    "WaitFamily",
    "human_turn_gaps",
    "synthetic_family",
]

Sampler = Callable[[int, np.random.Generator], np.ndarray]

#: Mixture components, as the seed gives them (seconds).
MIX_SHORT_MEAN_S = 60.0
MIX_SHORT_WEIGHT = 0.5
MIX_LONG_MEAN_S = 3540.0
MIX_LONG_SIGMA = 0.7
LOGNORMAL_SIGMA = 1.0


def _lognormal(n: int, rng: np.random.Generator, mean: float, sigma: float) -> np.ndarray:
    return rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, n)


def _raw_lognormal(n: int, rng: np.random.Generator) -> np.ndarray:
    return _lognormal(n, rng, 1.0, LOGNORMAL_SIGMA)


def _raw_exponential(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.exponential(1.0, n)


def _raw_mixture(n: int, rng: np.random.Generator) -> np.ndarray:
    short = rng.random(n) < MIX_SHORT_WEIGHT
    return np.where(
        short,
        rng.exponential(MIX_SHORT_MEAN_S, n),
        _lognormal(n, rng, MIX_LONG_MEAN_S, MIX_LONG_SIGMA),
    )


#: name -> (sampler, its mean): samples are scaled by ``W_ref / mean``.
SYNTHETIC_FAMILIES: dict[str, tuple[Sampler, float]] = {
    "lognormal": (_raw_lognormal, 1.0),
    "exponential": (_raw_exponential, 1.0),
    "mixture": (
        _raw_mixture,
        MIX_SHORT_WEIGHT * MIX_SHORT_MEAN_S + (1 - MIX_SHORT_WEIGHT) * MIX_LONG_MEAN_S,
    ),
}
FAMILY_NAMES = (*SYNTHETIC_FAMILIES, "claude-code")


@dataclass(frozen=True)
class WaitFamily:
    """A wait distribution scaled to mean ``w_ref_s``; ``split`` picks the sample pool."""

    name: str
    w_ref_s: float
    _sample: Callable[[int, np.random.Generator, str], np.ndarray]

    def sample(self, n: int, rng: np.random.Generator, split: str = "heldout") -> np.ndarray:
        if split not in ("calibration", "heldout"):
            raise ValueError("split must be 'calibration' or 'heldout'")
        return self._sample(n, rng, split)


def synthetic_family(name: str, w_ref_s: float) -> WaitFamily:
    sampler, mean = SYNTHETIC_FAMILIES[name]
    scale = w_ref_s / mean

    def sample(n: int, rng: np.random.Generator, _split: str) -> np.ndarray:
        return sampler(n, rng) * scale

    return WaitFamily(name, w_ref_s, sample)


@dataclass(frozen=True)
class EmpiricalWaits:
    """Human-turn gaps of a trace, split by session into calibration and held-out pools."""

    calibration: np.ndarray
    heldout: np.ndarray
    sessions: int

    @property
    def raw_mean_s(self) -> float:
        return float(np.concatenate([self.calibration, self.heldout]).mean())

    def family(self, w_ref_s: float, scaling: str = "pooled") -> WaitFamily:
        """``scaling``: ``pooled`` (the default) scales both halves by the pooled mean: one
        time unit for calibration and held-out, as a deployment sees them (its calibration
        sample and the waits that follow are both seconds, and whatever separates them is
        the users, not the clock). ``half`` (issue 13's family, kept to compare) scales each
        half to mean ``w_ref_s`` by its own mean, which makes the nominal load exact in each
        half but puts the halves in different units: their raw means differ by 27% (1,048 vs
        822 s, each dominated by a few gaps of hours), so ``half`` stretches every held-out
        gap 1.28 x against the calibration ones. That is no property of approval waits but
        of how the family was built; it reverses the halves' order on the body of the law
        that the timers act on: ``E[min(W, 1,800 s)]`` is 551 vs 584 s (calibration vs
        held-out) under ``half`` and 581 vs 543 s under ``pooled`` (408 vs 378 s raw), and
        ``P(W > 3,600 s)`` 7.4% vs 9.6% against 8.5% vs 8.5%. The halves still differ under
        ``pooled`` (their users do): that difference is the real one a calibration faces. The
        synthetic families are unaffected."""
        pools = {"calibration": self.calibration, "heldout": self.heldout}
        if scaling == "pooled":
            pooled = w_ref_s / self.raw_mean_s
            scales = dict.fromkeys(pools, pooled)
        elif scaling == "half":
            scales = {k: w_ref_s / float(v.mean()) for k, v in pools.items()}
        else:
            raise ValueError(f"scaling must be 'half' or 'pooled', got {scaling!r}")

        def sample(n: int, rng: np.random.Generator, split: str) -> np.ndarray:
            pool = pools[split]
            return pool[rng.integers(0, len(pool), n)] * scales[split]

        return WaitFamily("claude-code", w_ref_s, sample)


def _half(session_id: str) -> str:
    digest = hashlib.sha256(session_id.encode()).digest()
    return "calibration" if digest[0] % 2 == 0 else "heldout"


def human_turn_gaps(path: Path) -> EmpiricalWaits:
    """The gaps before human ``text`` turns (a session's first call has none) per half."""
    pools: dict[str, list[float]] = {"calibration": [], "heldout": []}
    sessions = 0
    for line_no, obj in json_lines(path):
        requests = obj.get("requests")
        if not isinstance(requests, list):
            raise TraceError(f"{path}:{line_no}: expected a Claude Code session with 'requests'")
        sessions += 1
        pool = pools[_half(str(obj.get("id", line_no)))]
        calls = [r for r in requests if isinstance(r, dict) and r.get("type") in ("n", "s")]
        for call in calls[1:]:
            kinds = call.get("input_types") or ()
            gap = call.get("think_time")
            # A zero gap is a client artefact, not a wait.
            if "text" in kinds and isinstance(gap, int | float) and math.isfinite(gap) and gap > 0:
                pool.append(float(gap))
    for split, values in pools.items():
        if len(values) < 10:
            raise TraceError(f"{path}: only {len(values)} human-turn gaps in the {split} half")
    return EmpiricalWaits(np.asarray(pools["calibration"]), np.asarray(pools["heldout"]), sessions)
