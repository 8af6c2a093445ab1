"""Hardware profiles for the engine model: public facts, plus explicit efficiency assumptions.

Every number carries its source. The efficiency factors are assumptions (stated as such), set
once from public measurements of the kernels involved and never tuned to replay results.

Step time is a roofline: ``max(compute, memory)``, where compute counts the dense matmuls
(``2 * params`` FLOPs per token) plus attention (``4 * layers * heads * head_dim`` FLOPs per
query token per context token), and memory counts the weights read once per step plus the KV
read by the batch's attention.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tenure.service.policy.endurance import Endurance

__all__ = [
    "PROFILES",
    "PROFILE_DIR",
    "SSD_PROFILES",
    "HardwareProfile",
    "SsdProfile",
    "get_profile",
    "get_ssd",
    "load_profile_file",
]

GB = 1e9
GIB = 1024**3


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    description: str
    # --- accelerators -----------------------------------------------------------------------
    gpus: int
    hbm_bytes_per_gpu: float
    hbm_bandwidth_per_gpu: float  # bytes/s
    bf16_dense_flops_per_gpu: float  # FLOP/s
    pcie_bandwidth_per_gpu: float  # bytes/s, one direction (host -> device)
    # --- model ------------------------------------------------------------------------------
    params: float
    weight_bytes: float
    layers: int
    attention_width: int  # query heads * head_dim
    kv_bytes_per_token: int
    # --- serving engine (vLLM defaults) -----------------------------------------------------
    gpu_memory_utilization: float
    runtime_reserve_bytes: float  # activations, CUDA graphs, non-torch allocations
    max_num_batched_tokens: int
    max_num_seqs: int
    # --- efficiency assumptions -------------------------------------------------------------
    mfu: float  # achieved fraction of dense BF16 peak in prefill-heavy steps
    hbm_efficiency: float  # achieved fraction of HBM bandwidth in memory-bound steps
    pcie_efficiency: float  # achieved fraction of PCIe bandwidth for pinned host copies
    tp_efficiency: float  # fraction of linear scaling kept under tensor parallelism
    # Fixed cost of one engine step beyond its roofline (scheduling, sampling, the Python
    # around the kernels): negligible against an 8B model's GPU steps (0 there), dominant for
    # a tiny model on CPU, where it is measured (``tenure calibrate-profile``).
    step_overhead_s: float = 0.0
    # Fixed cost of one host-tier transfer (measured by ``tenure calibrate-profile --gpu``;
    # 0 in the spec profiles, which model bandwidth only).
    transfer_latency_s: float = 0.0

    def kv_pool_bytes(self) -> float:
        """GPU memory left for the KV cache, as vLLM sizes it."""
        total = self.gpus * self.hbm_bytes_per_gpu * self.gpu_memory_utilization
        return total - self.weight_bytes - self.runtime_reserve_bytes

    def kv_pool_blocks(self, block_tokens: int) -> int:
        return int(self.kv_pool_bytes() // (block_tokens * self.kv_bytes_per_token))

    def load_bandwidth(self) -> float:
        """Host -> GPU bytes/s for a KV load (each TP rank loads its own shard in parallel)."""
        return self.gpus * self.pcie_bandwidth_per_gpu * self.pcie_efficiency

    def step_seconds(self, tokens: int, attn_token_ctx: float, kv_tokens_read: float) -> float:
        """One engine step over ``tokens`` batched tokens.

        ``attn_token_ctx``: sum over query tokens of the context each attends to;
        ``kv_tokens_read``: context tokens whose KV the step reads from HBM.
        """
        scale = self.gpus * self.tp_efficiency
        flops = (
            2.0 * self.params * tokens + 4.0 * self.layers * self.attention_width * attn_token_ctx
        )
        compute = flops / (self.bf16_dense_flops_per_gpu * self.mfu * scale)
        moved = self.weight_bytes + self.kv_bytes_per_token * kv_tokens_read
        memory = moved / (self.hbm_bandwidth_per_gpu * self.hbm_efficiency * scale)
        return self.step_overhead_s + (compute if compute > memory else memory)


# Llama-3.1-8B (meta-llama/Llama-3.1-8B config.json): 32 layers, hidden 4096, 32 heads,
# 8 KV heads, head_dim 128; 8.03e9 parameters (model card). KV per token in fp16:
# 2 (K, V) * 32 layers * 8 KV heads * 128 * 2 bytes = 131,072 B = 128 KiB.
_LLAMA8B: dict[str, Any] = {
    "params": 8.03e9,
    "weight_bytes": 8.03e9 * 2,
    "layers": 32,
    "attention_width": 32 * 128,
    "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2,
}
# Llama-3.1-70B (meta-llama/Llama-3.1-70B config.json): 80 layers, hidden 8192, 64 heads,
# 8 KV heads, head_dim 128; 70.6e9 parameters (model card). KV per token in fp16:
# 2 * 80 * 8 * 128 * 2 bytes = 327,680 B = 320 KiB.
_LLAMA70B: dict[str, Any] = {
    "params": 70.6e9,
    "weight_bytes": 70.6e9 * 2,
    "layers": 80,
    "attention_width": 64 * 128,
    "kv_bytes_per_token": 2 * 80 * 8 * 128 * 2,
}
_EFFICIENCY: dict[str, Any] = {
    # Assumption: a whole prefill step (GEMMs + attention + everything else) reaches about
    # half of dense BF16 peak; FlashAttention-3 (Shah et al., 2024) reports 75% of H100 peak
    # for the attention kernel alone, FlashAttention-2 (Dao, 2023) 50-73% on A100.
    "mfu": 0.5,
    # Assumption: memory-bound decode kernels stream at ~80% of peak HBM bandwidth (the range
    # NVIDIA's and vendors' STREAM-style measurements report for HBM3/HBM2e).
    "hbm_efficiency": 0.8,
    # Assumption: pinned-memory cudaMemcpy reaches ~80% of the PCIe link (e.g. ~25 GB/s of
    # 32 GB/s on Gen4 x16, ~50 GB/s of 64 GB/s on Gen5 x16 in bandwidthTest reports).
    "pcie_efficiency": 0.8,
}
# vLLM 0.32 engine defaults (vllm/config/cache.py: gpu_memory_utilization=0.92;
# vllm/engine/arg_utils.py: OpenAI server max_num_batched_tokens / max_num_seqs = 8192 / 1024
# on >= 70 GB non-A100 GPUs, 2048 / 256 on A100). The runtime reserve (activations at the
# batch-token budget, CUDA graphs, NCCL buffers) is an assumption of a few GiB.

PROFILES: dict[str, HardwareProfile] = {
    "h100-llama3-8b": HardwareProfile(
        name="h100-llama3-8b",
        description="1x H100 SXM 80 GB, Llama-3.1-8B fp16",
        gpus=1,
        # NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s,
        # BF16 1,979 TFLOPS with sparsity = 989 TFLOPS dense; PCIe Gen5 x16 = 64 GB/s/direction.
        hbm_bytes_per_gpu=80 * GB,
        hbm_bandwidth_per_gpu=3.35e12,
        bf16_dense_flops_per_gpu=989e12,
        pcie_bandwidth_per_gpu=64 * GB,
        **_LLAMA8B,
        gpu_memory_utilization=0.92,
        runtime_reserve_bytes=4 * GIB,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        tp_efficiency=1.0,
        **_EFFICIENCY,
    ),
    "a100-llama3-8b": HardwareProfile(
        name="a100-llama3-8b",
        description="1x A100 SXM 80 GB, Llama-3.1-8B fp16",
        gpus=1,
        # NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM): HBM2e 2,039 GB/s, BF16 312 TFLOPS
        # dense; PCIe Gen4 x16 = 32 GB/s/direction (64 GB/s bidirectional).
        hbm_bytes_per_gpu=80 * GB,
        hbm_bandwidth_per_gpu=2.039e12,
        bf16_dense_flops_per_gpu=312e12,
        pcie_bandwidth_per_gpu=32 * GB,
        **_LLAMA8B,
        gpu_memory_utilization=0.92,
        runtime_reserve_bytes=4 * GIB,
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        tp_efficiency=1.0,
        **_EFFICIENCY,
    ),
    "h200-llama3-8b": HardwareProfile(
        name="h200-llama3-8b",
        description="1x H200 SXM 141 GB, Llama-3.1-8B fp16",
        gpus=1,
        # NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, BF16 1,979
        # TFLOPS with sparsity = 989 TFLOPS dense (the H100's compute); PCIe Gen5 x16 =
        # 64 GB/s/direction. The spec-side twin of the measured h200-llama3-8b-measured.
        hbm_bytes_per_gpu=141 * GB,
        hbm_bandwidth_per_gpu=4.8e12,
        bf16_dense_flops_per_gpu=989e12,
        pcie_bandwidth_per_gpu=64 * GB,
        **_LLAMA8B,
        gpu_memory_utilization=0.92,
        runtime_reserve_bytes=4 * GIB,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        tp_efficiency=1.0,
        **_EFFICIENCY,
    ),
    "h100nvl4-llama3-70b": HardwareProfile(
        name="h100nvl4-llama3-70b",
        description="4x H100 NVL 94 GB, tensor parallel 4, Llama-3.1-70B fp16",
        gpus=4,
        # NVIDIA H100 NVL datasheet: 94 GB HBM3, 3.9 TB/s, BF16 1,671 TFLOPS with sparsity =
        # 835 TFLOPS dense; PCIe Gen5 x16 = 64 GB/s/direction per GPU.
        hbm_bytes_per_gpu=94 * GB,
        hbm_bandwidth_per_gpu=3.9e12,
        bf16_dense_flops_per_gpu=835e12,
        pcie_bandwidth_per_gpu=64 * GB,
        **_LLAMA70B,
        gpu_memory_utilization=0.92,
        runtime_reserve_bytes=4 * 4 * GIB,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        # Assumption: TP4 keeps ~80% of linear scaling (two all-reduces per layer; H100 NVL
        # pairs are NVLink-bridged, the pairs talk over PCIe).
        tp_efficiency=0.8,
        **_EFFICIENCY,
    ),
}


# The live A/B's engine (``tenure up``): vLLM's CPU build serving the tiny random-weight Llama
# (tenure.service.tools.tiny_model: hidden 256, MLP 512, 2 layers, 4 heads x 64, vocabulary
# 2051) in float32 on this 2-core VM. Shape and batch limits are the engine's configuration
# (tenure.service.live.cli.ENGINE_DEFAULTS). The speeds are one `tenure calibrate-profile` run
# (results/live/profile_cpu.json: vLLM's own per-request prefill/decode timers and its
# offloading worker's transfer counters, median of 5), taken before the A/B it is compared
# with and never fitted to a result: step overhead = the median decode step of a 16-token
# context; "HBM" bandwidth = KV bytes of a 2048-token context / the extra time its decode step
# takes (on this CPU that is the attention kernel's cost per context token, not a DRAM
# stream); FLOP/s = the least-squares fit of fresh-prompt prefill times to the roofline's
# dense + attention terms; "PCIe" = bytes / seconds of the offloading worker's host-tier loads.
# ``weight_bytes`` is 0 in the memory term because the short-decode step, which is all
# overhead, already includes reading the 7 MB of weights (cache-resident on this CPU); counting
# them again at the KV slope would add 36 ms to every step that was measured at 6.6 ms. The
# VM is shared: a second calibration under heavier load from other jobs measured 3.5x the
# step overhead (23 ms) and 7x the 256-token prefill, so every time figure of the simulated
# arms is as good as the machine's quiet moments.
_TINY_PARAMS = 2 * (4 * 256 * 256 + 3 * 256 * 512) + 256 * 2051
PROFILES["cpu-tiny-fp32"] = HardwareProfile(
    name="cpu-tiny-fp32",
    description="vLLM CPU (2 vCPU, AVX2), tiny Llama float32 (the live A/B's engine)",
    gpus=1,
    hbm_bytes_per_gpu=200 * 32 * 4096,
    hbm_bandwidth_per_gpu=2.03e8,
    bf16_dense_flops_per_gpu=5.90e10,
    pcie_bandwidth_per_gpu=1.16e9,
    params=float(_TINY_PARAMS),
    weight_bytes=0.0,
    layers=2,
    attention_width=256,
    kv_bytes_per_token=2 * 2 * 256 * 4,
    gpu_memory_utilization=1.0,
    runtime_reserve_bytes=0.0,
    max_num_batched_tokens=2048,
    max_num_seqs=8,
    mfu=1.0,
    hbm_efficiency=1.0,
    pcie_efficiency=1.0,
    tp_efficiency=1.0,
    step_overhead_s=0.0066,
)


#: Measured profiles committed with the code (``tenure calibrate-profile --gpu`` writes here).
PROFILE_DIR = Path(__file__).resolve().parent / "profiles"
#: More directories of profile files, ``os.pathsep``-separated (searched first).
PROFILE_PATH_ENV = "TENURE_HARDWARE_PATH"


def _profile_dirs() -> list[Path]:
    extra = os.environ.get(PROFILE_PATH_ENV, "")
    return [Path(p) for p in extra.split(os.pathsep) if p] + [PROFILE_DIR]


def load_profile_file(path: Path) -> HardwareProfile:
    """A profile file written by ``tenure calibrate-profile --gpu`` (its ``profile`` part)."""
    from tenure.service.errors import UsageError

    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        values = document["profile"]
        known = {f.name for f in fields(HardwareProfile)}
        return HardwareProfile(**{k: v for k, v in values.items() if k in known})
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not a hardware profile file ({exc})") from None


def _file_profiles() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for directory in reversed(_profile_dirs()):
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else ():
            found[path.stem] = path
    return found


def get_profile(name: str) -> HardwareProfile:
    """A spec profile of :data:`PROFILES`, or a measured one by its file name (without .json)
    in ``$TENURE_HARDWARE_PATH`` or :data:`PROFILE_DIR`."""
    from tenure.service.errors import UsageError

    profile = PROFILES.get(name)
    if profile is not None:
        return profile
    files = _file_profiles()
    if name in files:
        return load_profile_file(files[name])
    valid = sorted({*PROFILES, *files})
    raise UsageError(f"unknown hardware {name!r}; valid: {', '.join(valid)}")


@dataclass(frozen=True, slots=True)
class SsdProfile:
    """An NVMe SSD as the offload hierarchy's secondary tier (vLLM's ``fs`` tier).

    Bandwidths are the datasheet's sequential figures (128 KiB transfers): KV blocks are
    megabytes each and the ``fs`` tier writes one file per block, so large-transfer rates apply.
    """

    name: str
    description: str
    capacity_bytes: float
    read_bandwidth: float  # bytes/s
    write_bandwidth: float  # bytes/s
    dwpd: float  # rated drive writes per day over the warranty
    warranty_years: float
    source: str

    @property
    def endurance(self) -> Endurance:
        """Rated endurance: ``DWPD x capacity x 365 x warranty_years`` (= the datasheet TBW)."""
        return Endurance.from_dwpd(self.dwpd, self.capacity_bytes, self.warranty_years)

    def endurance_for(self, capacity_bytes: float) -> Endurance:
        """The family's endurance at another capacity (DWPD is the per-capacity rating)."""
        return Endurance.from_dwpd(self.dwpd, capacity_bytes, self.warranty_years)


TB = 1e12
MB = 1e6

# Micron 7450 SSD product brief and datasheet (micron.com, "Micron 7450 SSD", PCIe Gen4 NVMe,
# U.3 15 mm): the PRO line is rated 1 DWPD and the MAX line 3 DWPD, both over a 5-year limited
# warranty; U.3 sequential read 6,800 MB/s; sequential write 5,300 MB/s at 3.84 TB (PRO) and
# 3.2 TB (MAX). Rated TBW = DWPD x capacity x 365 x 5: 7,008 TB for the 3.84 TB PRO (Micron
# quotes 7.0 PBW), 17,520 TB for the 3.2 TB MAX (17.5 PBW).
SSD_PROFILES: dict[str, SsdProfile] = {
    "micron-7450-pro-3.84tb": SsdProfile(
        name="micron-7450-pro-3.84tb",
        description="Micron 7450 PRO 3.84 TB U.3 (read-intensive, 1 DWPD / 5 y)",
        capacity_bytes=3.84 * TB,
        read_bandwidth=6800 * MB,
        write_bandwidth=5300 * MB,
        dwpd=1.0,
        warranty_years=5.0,
        source="Micron 7450 SSD product brief / datasheet (micron.com)",
    ),
    "micron-7450-max-3.2tb": SsdProfile(
        name="micron-7450-max-3.2tb",
        description="Micron 7450 MAX 3.2 TB U.3 (mixed-use, 3 DWPD / 5 y)",
        capacity_bytes=3.2 * TB,
        read_bandwidth=6800 * MB,
        write_bandwidth=5300 * MB,
        dwpd=3.0,
        warranty_years=5.0,
        source="Micron 7450 SSD product brief / datasheet (micron.com)",
    ),
}


def get_ssd(name: str) -> SsdProfile:
    from tenure.service.errors import UsageError

    profile = SSD_PROFILES.get(name)
    if profile is None:
        raise UsageError(f"unknown SSD {name!r}; valid: {', '.join(sorted(SSD_PROFILES))}")
    return profile
