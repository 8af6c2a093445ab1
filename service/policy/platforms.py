"""Calibrated price vectors of the seed's three platforms (seed 002, Appendix B/C, Table 3).

Each platform is kept as what was *measured* (KV pool size, suffix re-prefill TTFT, host link
bandwidth) and the price vector is derived from it with the seed's recipe, so the derived
numbers in Table 3 (alpha1, t1, t*) are checked rather than copied:

* ``alpha1 = ranks * suffix_tokens / kv_pool_tokens``: the share of the node's KV pool one
  suspended context's private suffix holds, charged across the tensor-parallel ranks
  (GPU-seconds per second of residency);
* ``beta2``: the host-resume allowance for GPU-side scheduling/synchronisation (0.02 GPU-s on
  every platform; Table 3's t1 = beta2 / alpha1 agrees);
* ``beta3 = ranks * TTFT(suffix re-prefill, shared prefix cached)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tenure.service.policy.retention import PriceVector

__all__ = ["PLATFORMS", "Platform", "alpha1_from_pool", "get_platform"]

#: The seed's median private suffix of an approval-gated context (tokens).
SEED_SUFFIX_TOKENS = 3000
#: The seed's host-resume allowance (GPU-s), Appendix B.
SEED_BETA2_GPU_S = 0.02


def alpha1_from_pool(*, ranks: int, suffix_tokens: float, kv_pool_tokens: float) -> float:
    """HBM holding price: one context's share of the KV pool, charged over ``ranks`` GPUs."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks!r}")
    if not (math.isfinite(suffix_tokens) and suffix_tokens > 0):
        raise ValueError(f"suffix_tokens must be > 0, got {suffix_tokens!r}")
    if not (math.isfinite(kv_pool_tokens) and kv_pool_tokens > 0):
        raise ValueError(f"kv_pool_tokens must be > 0, got {kv_pool_tokens!r}")
    return ranks * suffix_tokens / kv_pool_tokens


@dataclass(frozen=True, slots=True)
class Platform:
    """One row of Table 3: the measured quantities; the price vector is derived."""

    name: str
    pcie_gb_s: float
    beta3_gpu_s: float
    kv_pool_tokens: int
    hbm: str
    ranks: int = 4
    suffix_tokens: int = SEED_SUFFIX_TOKENS
    beta2_gpu_s: float = SEED_BETA2_GPU_S

    @property
    def price(self) -> PriceVector:
        alpha1 = alpha1_from_pool(
            ranks=self.ranks, suffix_tokens=self.suffix_tokens, kv_pool_tokens=self.kv_pool_tokens
        )
        return PriceVector(alpha1=alpha1, beta2=self.beta2_gpu_s, beta3=self.beta3_gpu_s)


#: Table 3 (Llama-3.1-70B bf16, TP4). L40S is compute-bound over part of the range; its alpha1
#: is the KV-bound one, as the seed reports it.
PLATFORMS: dict[str, Platform] = {
    "h100-nvl": Platform("h100-nvl", 57.5, 1.91, 680_768, "4x94 GB"),
    "a100-sxm": Platform("a100-sxm", 26.2, 2.61, 516_976, "4x80 GB"),
    "l40s": Platform("l40s", 27.0, 5.14, 101_504, "4x48 GB"),
}


def get_platform(name: str) -> Platform:
    try:
        return PLATFORMS[name]
    except KeyError:
        raise ValueError(
            f"unknown platform {name!r}; valid: {', '.join(sorted(PLATFORMS))}"
        ) from None
