"""The ladder as a plain-text table (what ``tenure replay ladder`` prints)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenure.service.replay.hardware import GIB

__all__ = ["ladder_table"]


def _delta(entry: list[float] | None) -> str:
    if not entry:
        return "-"
    mean, lo, hi = entry
    if lo != lo:  # no bootstrap
        return f"{mean:+.1f}"
    return f"{mean:+.1f} [{lo:+.1f},{hi:+.1f}]"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def ladder_table(ladder: Mapping[str, Any]) -> str:
    cfg = ladder["config"]
    results = ladder["results"]
    paired = ladder.get("paired_delta_p95_vs", {})
    head = (
        f"{cfg.get('trace', '')}  hardware={cfg['hardware']}  rate={cfg['arrival_rate']}/s  "
        f"host={cfg['host_gib']} GiB  seeds={cfg['seeds']}  sessions={cfg['sessions_run']} "
        f"(+{cfg['sessions_skipped_oversize']} oversize skipped)  "
        f"p95 live WS={cfg['p95_live_working_set_gib']:.0f} GiB"
    )
    cols = (
        f"{'policy':<18} {'p50 JCT':>8} {'p95 JCT':>8} {'p95 CI (session)':>18} {'mean':>8} "
        f"{'p95 TTFT':>8} {'hit%':>6} {'sv/bnd':>6} {'stored GiB':>10} {'loaded GiB':>10} "
        f"{'turns/s':>8} "
        f"{'d p95 vs lru [CI]':>24} {'d p95 vs notier [CI]':>24}"
    )
    lines = [head, cols, "-" * len(cols)]
    for name, r in results.items():
        lo, hi = r.get("p95_jct_ci_session") or r["p95_jct_ci"]
        ci = "-" if lo != lo else f"[{lo:.1f}, {hi:.1f}]"
        lines.append(
            f"{name:<18} {r['p50_jct_s']:8.2f} {r['p95_jct_s']:8.2f} {ci:>18} "
            f"{r['mean_jct_s']:8.2f} {r['p95_ttft_s']:8.2f} {100 * r['host_hit_rate']:6.1f} "
            f"{_share(r.get('saved_over_bound')):>6} "
            f"{r['host_bytes_stored'] / GIB:10.0f} {r['host_bytes_loaded'] / GIB:10.0f} "
            f"{r['throughput_turns_per_s']:8.4f} "
            f"{_delta(paired.get('lru', {}).get(name)):>24} "
            f"{_delta(paired.get('notier', {}).get(name)):>24}"
        )
    return "\n".join(lines)
