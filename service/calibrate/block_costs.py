"""What a KV block costs to recompute, against what it costs to load from the host tier.

The question the live A/B's latency answers depends on this ratio: where a host-tier load costs
about as much as recomputing the block (the 2-layer, 256-wide tiny model on this CPU, issue 12),
fewer computed tokens buy no faster turns; on a GPU serving an 8B model recomputing a block
costs many times its load. Measured on a live engine as the user sees it (client-side time to
first token of one ``blocks``-block context, median of ``repeats``):

* ``gpu``: the context again at once, served from the engine's own prefix cache (the floor:
  one step, HTTP, the last token's prefill);
* ``fresh``: a context no cache has seen, every block recomputed;
* ``host``: the context after a flood pushed it out of the KV pool, its blocks loaded back
  from the host tier (vLLM's counters must say so, or the repeat is dropped).

recompute per block = (fresh - gpu) / blocks; load per block = (host - gpu) / blocks; the ratio
of the two. For a simulator profile the same two figures come from its physics
(:func:`tenure.service.live.speed.profile_block_costs`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tenure.service.calibrate.engine import EngineError, EngineProbe

__all__ = ["BlockCosts", "measure_block_costs"]


@dataclass
class BlockCosts:
    """Seconds per KV block: recomputed, loaded from the host tier; and their ratio."""

    block_tokens: int
    context_blocks: int
    recompute_s: float
    load_s: float
    #: Client-side TTFTs behind the figures (seconds): (gpu, fresh, host) per kept repeat.
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    #: Median time to first token of the whole context recomputed, and loaded from the host
    #: tier (seconds): their ratio is what a host hit buys a resumed turn, and it needs no
    #: floor subtracted (on a loaded machine the floor is as noisy as a load).
    ttft_fresh_s: float = 0.0
    ttft_host_s: float = 0.0

    @property
    def ratio(self) -> float:
        return self.recompute_s / self.load_s if self.load_s > 0 else math.inf

    @property
    def ttft_ratio(self) -> float:
        return self.ttft_fresh_s / self.ttft_host_s if self.ttft_host_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "ttft_ratio": self.ttft_ratio}

    def describe(self) -> str:
        per_block = (
            f"{self.ratio:.1f}x"
            if math.isfinite(self.ratio)
            else "not measurable (a load was no slower than a cached context)"
        )
        return (
            f"a {self.context_blocks}-block context's TTFT recomputed / loaded from the host "
            f"tier = {self.ttft_fresh_s * 1e3:.1f} / {self.ttft_host_s * 1e3:.1f} ms = "
            f"{self.ttft_ratio:.1f}x; per {self.block_tokens}-token block, over the cached "
            f"floor: recompute {self.recompute_s * 1e3:.2f} ms / load "
            f"{self.load_s * 1e3:.3f} ms = {per_block}"
        )


def measure_block_costs(
    probe: EngineProbe,
    *,
    context_blocks: int,
    repeats: int = 5,
    say: Callable[[str], None] = lambda _m: None,
) -> BlockCosts:
    """Measure on ``probe``'s engine (its host tier must hold a context and a pool's worth of
    flood: ``tenure calibrate-profile``'s engine has a tier 4x its pool)."""
    info = probe.info or probe.discover()
    bt = info.block_tokens
    n = context_blocks * bt
    if n + bt > min(info.max_model_len, info.pool_tokens // 2):
        raise EngineError(f"a {context_blocks}-block context does not fit the engine's pool")
    flood_len = min(info.max_model_len - 8, info.pool_tokens // 2) // bt * bt
    floods = math.ceil((info.pool_tokens + bt) / flood_len)
    samples: list[tuple[float, float, float]] = []
    notes: list[str] = []
    for _ in range(repeats):
        context = probe.tokens(n)
        fresh, src = probe.measured(context)
        if src.computed < n - bt:
            notes.append("a fresh context was partly cached: repeat dropped")
            continue
        gpu, src = probe.measured(context)
        if src.local_hit < n - bt:
            notes.append("a repeated context missed the engine's prefix cache: repeat dropped")
            continue
        for _ in range(floods):
            probe.measured(probe.tokens(flood_len))
        host, src = probe.measured(context)
        if src.host < n - bt:
            notes.append(
                f"the flooded context came back {src.host:.0f} of {n} tokens from the host "
                "tier: repeat dropped"
            )
            continue
        samples.append((gpu, fresh, host))
        say(
            f"  block costs: TTFT {gpu * 1e3:.1f} ms cached, {fresh * 1e3:.1f} ms fresh, "
            f"{host * 1e3:.1f} ms from the host tier ({context_blocks} blocks)"
        )
    if not samples:
        raise EngineError("no repeat of the block-cost measurement was usable: " + "; ".join(notes))
    recompute = statistics.median(f - g for g, f, _h in samples) / context_blocks
    load = statistics.median(h - g for g, _f, h in samples) / context_blocks
    if load <= 0:
        notes.append(
            "a host-tier load was not slower than a cached context (the floor is noisy): the "
            "per-block ratio is not measurable, the TTFT ratio is"
        )
        load = 0.0
    return BlockCosts(
        bt,
        context_blocks,
        recompute,
        load,
        samples,
        notes,
        statistics.median(f for _g, f, _h in samples),
        statistics.median(h for _g, _f, h in samples),
    )
