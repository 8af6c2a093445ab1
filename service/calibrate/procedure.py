"""The price-vector measurement of seed 002, Appendix B, against one live engine.

Each repeat uses a fresh private suffix behind one shared prefix:

1. warm the shared prefix (so it sits in the engine's prefix cache);
2. **recompute**: prefix + new suffix. Only the suffix is computed: its TTFT is the suffix
   re-prefill with the shared prefix cached, the seed's ``beta3`` measurement (client-side, so
   it includes API overhead: the seed's "conservative end-to-end charge"). The tokens the engine
   computed are the suspended context's private footprint (``alpha1``);
3. **HBM resume**: the same prompt again, now all cached in HBM;
4. flood the engine's KV pool with unrelated prompts, so the context's blocks leave HBM (the
   offloading connector has a host copy);
5. **host resume**: the same prompt again, restored from the host tier (checked: vLLM must
   count the restored tokens as ``external_kv_transfer``).

Then (``ranks`` = GPUs of the tensor-parallel group, over which a second is charged):

* ``beta3 = ranks * median(TTFT recompute)``;
* ``beta2 = ranks * max(0, median(TTFT host resume - TTFT HBM resume))``: what restoring from
  host adds over a resident resume (the API overhead cancels in the difference); an upper
  bound of the GPU-side cost, since the copy can overlap other work;
* ``alpha1 = ranks * footprint / KV pool tokens`` (GPU-s per second resident).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tenure.service.calibrate.engine import EngineError, EngineInfo, EngineProbe
from tenure.service.policy.platforms import alpha1_from_pool
from tenure.service.policy.retention import PriceVector

__all__ = ["Calibration", "CalibrationPlan", "Spread", "calibrate", "plan_for"]

#: The seed's median approval-gate context: 5.4K shared prefix, 3.0K private suffix.
SEED_PREFIX_TOKENS = 5400
SEED_SUFFIX_TOKENS = 3000


@dataclass(frozen=True, slots=True)
class Spread:
    median: float
    low: float
    high: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values), tuple(values))


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    prefix_tokens: int
    suffix_tokens: int
    repeats: int
    ranks: int = 1
    #: A fixed host-resume allowance instead of measuring it (the seed used 0.02 GPU-s).
    beta2_gpu_s: float | None = None
    #: Charge this many tokens per suspended context in alpha1 instead of the measured one.
    footprint_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("prefix_tokens", "suffix_tokens", "repeats", "ranks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.beta2_gpu_s is not None and not (
            math.isfinite(self.beta2_gpu_s) and self.beta2_gpu_s >= 0
        ):
            raise ValueError(f"beta2 must be a finite number >= 0, got {self.beta2_gpu_s!r}")
        if self.footprint_tokens is not None and self.footprint_tokens < 1:
            raise ValueError(f"footprint_tokens must be >= 1, got {self.footprint_tokens!r}")


def plan_for(
    info: EngineInfo,
    *,
    repeats: int,
    ranks: int = 1,
    prefix_tokens: int | None = None,
    suffix_tokens: int | None = None,
    beta2_gpu_s: float | None = None,
    footprint_tokens: int | None = None,
) -> CalibrationPlan:
    """The seed's 5.4K + 3.0K context, shrunk (same proportions) to what the engine holds."""
    room = min(info.max_model_len - 8, info.pool_tokens - 2 * info.block_tokens)
    if room < 2 * info.block_tokens:
        raise ValueError(
            f"the engine's KV pool ({info.pool_tokens} tokens) or max_model_len "
            f"({info.max_model_len}) is too small for a cached prefix plus a suffix"
        )
    total = min(SEED_PREFIX_TOKENS + SEED_SUFFIX_TOKENS, room)
    if prefix_tokens is None:
        share = SEED_PREFIX_TOKENS / (SEED_PREFIX_TOKENS + SEED_SUFFIX_TOKENS)
        # Whole blocks: only full blocks are cached, so the suffix starts on a block boundary.
        prefix_tokens = max(
            info.block_tokens, int(total * share) // info.block_tokens * info.block_tokens
        )
    if suffix_tokens is None:
        # Not block-aligned: a fully cached prompt makes vLLM recompute its whole last block,
        # which would make the "resident" resume compute more than one token.
        suffix_tokens = max(1, total - prefix_tokens - info.block_tokens // 4)
    if prefix_tokens + suffix_tokens > room:
        raise ValueError(
            f"prefix_tokens + suffix_tokens = {prefix_tokens + suffix_tokens} exceeds what the "
            f"engine holds here ({room} tokens: max_model_len and KV pool)"
        )
    return CalibrationPlan(
        prefix_tokens, suffix_tokens, repeats, ranks, beta2_gpu_s, footprint_tokens
    )


@dataclass(frozen=True)
class Calibration:
    """The measured price vector and everything it was derived from."""

    engine: str
    model: str
    pool_tokens: int
    block_tokens: int
    plan: CalibrationPlan
    price: PriceVector
    footprint_tokens: float
    recompute_s: Spread
    hbm_resume_s: Spread
    host_resume_s: Spread | None
    host_extra_s: Spread | None
    host_restored_tokens: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["price"] = {
            "alpha1_gpu_s_per_s": self.price.alpha1,
            "beta2_gpu_s": self.price.beta2,
            "beta3_gpu_s": self.price.beta3,
        }
        doc["t1_s"] = self.price.t1
        doc["t_star_s"] = self.price.t_star
        return doc


def _flood(probe: EngineProbe, info: EngineInfo) -> None:
    """Unrelated prompts totalling a pool and a block: every older block leaves HBM (LRU)."""
    length = max(info.block_tokens, min(info.max_model_len - 8, info.pool_tokens // 2))
    for _ in range(math.ceil((info.pool_tokens + info.block_tokens) / length)):
        probe.ttft(probe.tokens(length))


def calibrate(
    probe: EngineProbe, plan: CalibrationPlan, say: Callable[[str], None] = lambda _m: None
) -> Calibration:
    """Run the repeats; raise :class:`EngineError` when the engine does not behave as needed."""
    info = probe.info or probe.discover()
    prefix = probe.tokens(plan.prefix_tokens)
    block = info.block_tokens
    cacheable = (plan.prefix_tokens + plan.suffix_tokens - 1) // block * block
    recompute: list[float] = []
    hbm: list[float] = []
    host: list[float] = []
    extra: list[float] = []
    footprints: list[float] = []
    restored: list[float] = []
    notes: list[str] = []
    partial = 0
    for rep in range(plan.repeats):
        probe.ttft(prefix + probe.tokens(8))  # warm the shared prefix
        context = prefix + probe.tokens(plan.suffix_tokens)
        seconds, src = probe.measured(context)
        if src.local_hit + src.host < plan.prefix_tokens // block * block * 0.9:
            notes.append(f"repeat {rep}: the shared prefix was not cached ({src})")
        recompute.append(seconds)
        footprints.append(src.computed)
        hit_s, _src = probe.measured(context)
        hbm.append(hit_s)
        if plan.beta2_gpu_s is None:
            _flood(probe, info)
            host_s, src = probe.measured(context)
            if src.host < 0.9 * cacheable:
                # Part of the context was no longer on host (evicted there too): its TTFT
                # includes recompute, so it does not measure a host resume.
                partial += 1
                say(
                    f"  repeat {rep + 1}/{plan.repeats}: recompute {seconds * 1e3:.1f} ms, HBM "
                    f"resume {hit_s * 1e3:.1f} ms, host resume only partial (not used)"
                )
                continue
            host.append(host_s)
            extra.append(host_s - hit_s)
            restored.append(src.host)
        say(
            f"  repeat {rep + 1}/{plan.repeats}: recompute {seconds * 1e3:.1f} ms, HBM resume "
            f"{hit_s * 1e3:.1f} ms"
            + (
                f", host resume {host[-1] * 1e3:.1f} ms"
                if plan.beta2_gpu_s is None and host
                else ""
            )
        )
    if plan.beta2_gpu_s is None and not host:
        raise EngineError(
            f"no host-tier resume observed in {plan.repeats} repeats (vLLM counted no full "
            "external_kv_transfer): is the engine running with a KV offloading connector, and "
            "is its host tier larger than one context? (or pass --beta2 to use an allowance)"
        )
    if partial:
        notes.append(f"{partial} host resume(s) restored only part of the context; not used")
    footprint = float(plan.footprint_tokens or statistics.median(footprints))
    if footprint <= 0:
        raise EngineError("the engine computed no tokens for a fresh suffix (footprint 0)")
    alpha1 = alpha1_from_pool(
        ranks=plan.ranks, suffix_tokens=footprint, kv_pool_tokens=info.pool_tokens
    )
    beta3 = plan.ranks * statistics.median(recompute)
    if plan.beta2_gpu_s is not None:
        beta2 = plan.beta2_gpu_s
    else:
        beta2 = plan.ranks * max(0.0, statistics.median(extra))
    if plan.beta2_gpu_s is not None and beta3 < beta2:
        # The allowance is the operator's, the recompute this engine's: say which to change
        # (the seed's 0.02 GPU-s is an H100 figure, about a small model's whole recompute).
        raise EngineError(
            f"the measured recompute, beta3 {beta3:.4g} GPU-s, is below the --beta2 allowance "
            f"{beta2:.4g} GPU-s: pass an allowance scaled to this engine, or leave --beta2 out "
            "to measure the host resume"
        )
    try:
        price = PriceVector(alpha1=alpha1, beta2=beta2, beta3=beta3)
    except ValueError as exc:
        raise EngineError(f"measured an unusable price vector: {exc}") from None
    return Calibration(
        probe.url,
        info.model,
        info.pool_tokens,
        block,
        plan,
        price,
        footprint,
        Spread.of(recompute),
        Spread.of(hbm),
        Spread.of(host) if host else None,
        Spread.of(extra) if extra else None,
        statistics.median(restored) if restored else 0.0,
        notes,
    )
