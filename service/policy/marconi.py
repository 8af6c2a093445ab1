"""Marconi-style utility eviction: trade recency against the compute a resident prefix saves.

Utility of a session's resident prefix = ``alpha`` * normalised recency + (1 - ``alpha``) *
normalised FLOP efficiency, where FLOP efficiency is the prefill compute the prefix saves per
byte it occupies. For a dense transformer the prefill of ``L`` tokens costs about
``linear_flops_per_token * L + attn_flops_per_token_sq * L**2`` FLOPs while its KV grows as
``L``, so FLOPs per byte grow linearly with the prefix length: long prefixes are worth more per
byte. Lowest utility is evicted first (tail-first); eviction-only. Defaults are Llama-3.1-8B:
2 x 8.0e9 parameters FLOPs per token, 2 x 32 layers x 4096 hidden for the attention term.
"""

from __future__ import annotations

from tenure.service.policy.sessions import SessionPolicy
from tenure.service.policy.types import EvictionClass

__all__ = ["MarconiPolicy"]


class MarconiPolicy(SessionPolicy):
    name = "marconi"
    defaults = {
        "alpha": 0.5,
        "linear_flops_per_token": 1.6e10,
        "attn_flops_per_token_sq": 2.62144e5,
        "block_tokens": 64.0,
    }
    sweep = {"alpha": (0.1, 0.5, 0.9)}

    def victim_order(
        self, n: int, incoming: str | None, candidates: dict[str, int], now: float
    ) -> list[tuple[str, EvictionClass]] | None:
        rows = [(s, self.peek(s).last_activity, b) for s, b in candidates.items()]
        rows = [r for r in rows if not self.peek(r[0]).active]
        if sum(b for _, _, b in rows) < n:
            return None
        linear = self.params["linear_flops_per_token"]
        attn = self.params["attn_flops_per_token_sq"]
        tokens_per_block = self.params["block_tokens"]
        # FLOPs saved per token held (per byte up to a constant): linear + attn * L.
        efficiency = {s: linear + attn * b * tokens_per_block for s, _, b in rows}
        times = [t for _, t, _ in rows]
        t_lo, t_hi = min(times), max(times)
        e_lo, e_hi = min(efficiency.values()), max(efficiency.values())
        alpha = self.params["alpha"]

        def norm(x: float, lo: float, hi: float) -> float:
            return 0.0 if hi <= lo else (x - lo) / (hi - lo)

        scored = sorted(
            (
                alpha * norm(t, t_lo, t_hi) + (1 - alpha) * norm(efficiency[s], e_lo, e_hi),
                t,
                s,
            )
            for s, t, _ in rows
        )
        return [(s, EvictionClass.UTILITY) for _, _, s in scored]
