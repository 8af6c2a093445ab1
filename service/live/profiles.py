"""The simulator's profile of ``tenure up``'s engine, per random-weight model layout.

``tiny`` is the replay's ``cpu-tiny-fp32`` (the engine tests' 2-layer model, calibrated on the
quiet VM). ``demo`` is the model ``tenure up`` serves by default
(:data:`tenure.service.tools.tiny_model.DEMO_SHAPE`, issue 28), measured by ``tenure
calibrate-profile --layout demo --repeats 3`` on the quiet VM (load average under 2;
``results/live/profile_demo_quiet.json``). The first demo calibration
(``results/live/profile_demo_load30.json``) ran at load average 25-36 and measured a 42x slower
decode step; it is kept beside it as the reason the quiet figures matter. A profile is never
fitted to an A/B result, and the off-profile warning says when the engine ran far from it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tenure.service.replay.hardware import HardwareProfile, get_profile
from tenure.service.tools.tiny_model import DEMO_SHAPE

__all__ = [
    "CALIBRATED_BLOCK_COSTS",
    "DEMO_PROFILE",
    "DEMO_PROFILE_1CORE",
    "calibration_key",
    "engine_profile",
]

# Everything not restated here is the tiny calibration's (cpu-tiny-fp32): the same engine
# build, batch limits and efficiencies; the speeds and the shape are the demo model's own.
_TINY = get_profile("cpu-tiny-fp32")
DEMO_PROFILE = replace(
    _TINY,
    name="cpu-demo-fp32",
    description="vLLM CPU (2 vCPU, AVX2), demo Llama float32 (tenure up's engine)",
    hbm_bytes_per_gpu=200 * 32 * DEMO_SHAPE.kv_bytes_per_token(4),
    # results/live/profile_demo_quiet.json (quiet VM): the median short decode step (21.2 ms:
    # scheduling, sampling and reading the 51 MB of float32 weights), the decode slope over a
    # 2,048-token context (1.71 GB/s of KV), the least-squares FLOP/s of fresh prefills of
    # 256-2,048 tokens (77 GFLOP/s) and the offloading worker's host-tier loads (464 MB/s).
    # As for the tiny profile, weight_bytes stays 0: the short step already reads the weights.
    step_overhead_s=0.0212,
    hbm_bandwidth_per_gpu=1.71e9,
    bf16_dense_flops_per_gpu=7.70e10,
    pcie_bandwidth_per_gpu=4.64e8,
    params=float(DEMO_SHAPE.matmul_params),
    layers=DEMO_SHAPE.layers,
    attention_width=DEMO_SHAPE.hidden,
    kv_bytes_per_token=DEMO_SHAPE.kv_bytes_per_token(4),
)

#: The demo model on one core with one torch thread (what ``tenure up --side-by-side`` gives
#: each arm): ``tenure calibrate-profile --layout demo --cpus 1`` on the quiet VM
#: (``results/live/profile_demo_1core_quiet.json``). Its short step is faster than the two
#: threads' (15.4 vs 21.2 ms: no thread hand-off in small matmuls), its prefill ~1.9x slower.
DEMO_PROFILE_1CORE = replace(
    DEMO_PROFILE,
    name="cpu-demo-fp32-1core",
    description="vLLM CPU (1 core of 2, one thread, AVX2), demo Llama float32 (a side-by-side arm)",
    step_overhead_s=0.0154,
    hbm_bandwidth_per_gpu=1.39e9,
    bf16_dense_flops_per_gpu=4.11e10,
    pcie_bandwidth_per_gpu=2.40e8,
)

#: Recompute vs load of one 32-token block, measured by ``tenure calibrate-profile``'s TTFT
#: probe (:mod:`tenure.service.calibrate.block_costs`) per layout.
CALIBRATED_BLOCK_COSTS: dict[str, dict[str, Any]] = {
    # results/live/profile_demo_quiet.json, quiet VM: TTFT of a 32-block context, medians of
    # 3: 406.6 ms recomputed, 37.5 ms from the host tier, 32.2 ms cached; per 32-token block
    # over the cached floor, 11.02 ms recomputed vs 0.166 ms loaded (66x).
    "demo": {
        "context_blocks": 32,
        "ttft_fresh_s": 0.4066,
        "ttft_host_s": 0.0375,
        "ttft_ratio": 0.4066 / 0.0375,
        "machine": "2-core VM, quiet (load average under 2)",
    },
    # results/live/profile_demo_1core_quiet.json (--cpus 1), quiet VM: medians of 3, 670.3 ms
    # recomputed, 46.1 ms from the host tier; per block over the cached floor 20.0 vs 0.43 ms.
    "demo-1core": {
        "context_blocks": 32,
        "ttft_fresh_s": 0.6703,
        "ttft_host_s": 0.0461,
        "ttft_ratio": 0.6703 / 0.0461,
        "machine": "one core of the 2-core VM, quiet",
    },
}


def engine_profile(layout: str, cores: int = 0) -> HardwareProfile:
    """The simulator profile of the engine serving ``layout`` (``cores``: 1 for an engine
    pinned to one core, 0 for one on every core)."""
    if layout != "demo":
        return get_profile("cpu-tiny-fp32")
    return DEMO_PROFILE_1CORE if cores == 1 else DEMO_PROFILE


def calibration_key(layout: str, cores: int = 0) -> str:
    """The :data:`CALIBRATED_BLOCK_COSTS` entry of ``layout`` on ``cores``."""
    return f"{layout}-1core" if cores == 1 and layout == "demo" else layout
