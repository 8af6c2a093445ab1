"""The simulated arms of ``ab.json`` again with the engine 1x, 2x, 4x, 8x slower than the profile.

Every speed of ``cpu-tiny-fp32`` (step overhead, FLOP/s, the attention slope, host copies) is
divided by the factor; slice, schedule, seed, pool and tier are the run's. This is the measured
explanation of the simulator's prompt-token gap, not a fit: no factor is chosen from it.

    .venv/bin/python results/live/speed_sensitivity.py results/live/ab.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from tenure.service.live import report
from tenure.service.live.simulated import run_simulated
from tenure.service.live.workload import SliceSpec, build_workload, engine_trace
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.loaders import load_trace


def main(path: str) -> None:
    doc = json.loads(Path(path).read_text())
    c = doc["config"]
    spec = SliceSpec(
        Path(c["trace"]), sessions=c["sessions"], first=c["first"], max_turns=c["max_turns"],
        time_scale=c["time_scale"], max_gap_s=c["max_gap_s"],
        max_prompt_tokens=c["engine"]["max_model_len"] - 32,
    )  # fmt: skip
    work = build_workload(load_trace(spec.trace, "claude-code"), spec)
    etrace = engine_trace(work, c["engine"]["block_tokens"])
    base = get_profile(c["profile"])
    live = doc["arms"]
    print("live: " + "; ".join(
        f"{n} hit {a['host_hit_rate']:.1%} computed {a['prompt_tokens_computed']:,.0f} "
        f"gpu {a['prompt_tokens_cached_gpu']:,.0f} jct p50 {a['jct_p50_s']:.3f} s"
        for n, a in live.items()
    ))  # fmt: skip
    for slow in (1, 2, 4, 8):
        hw = replace(
            base,
            step_overhead_s=base.step_overhead_s * slow,
            bf16_dense_flops_per_gpu=base.bf16_dense_flops_per_gpu / slow,
            hbm_bandwidth_per_gpu=base.hbm_bandwidth_per_gpu / slow,
            pcie_bandwidth_per_gpu=base.pcie_bandwidth_per_gpu / slow,
        )
        parts = []
        for name in live:
            run = run_simulated(
                etrace, name, hw, gpu_blocks=c["engine"]["gpu_blocks"],
                host_blocks=c["engine"]["host_blocks"], arrival_rate=c["arrival_rate"],
                seed=c["seed"], policy_params=c["policy_params"][name],
            )  # fmt: skip
            a = report.simulated_arm(run, etrace)
            parts.append(
                f"{name} hit {a['host_hit_rate']:.1%} computed {a['prompt_tokens_computed']:,} "
                f"gpu {a['prompt_tokens_cached_gpu']:,} jct p50 {a['jct_p50_s']:.3f} s"
            )
        print(f"sim x{slow} slower: " + "; ".join(parts))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/live/ab.json")
