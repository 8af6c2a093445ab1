"""Settings for a small real vLLM engine on the CPU platform, with Tenure's offloading spec.

Shared by ``tenure up`` (:mod:`tenure.service.stack`), the calibration and the engine tests: one
place that knows the CPU build's quirks (see ``../shared/design/VLLM_SEAMS.md``). Plain data and
argument lists: it imports neither vLLM nor the rest of the adapter.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = [
    "CPU_BLOCK_TOKENS",
    "CPU_ENGINE_ENV",
    "apply_env",
    "bytes_per_block",
    "kv_transfer_config",
    "server_args",
]

#: The CPU attention backend's KV block, in tokens.
CPU_BLOCK_TOKENS = 128

#: Environment every CPU engine here runs with (no downloads, small KV pool, no CPU pinning).
CPU_ENGINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "TOKENIZERS_PARALLELISM": "false",
}


def bytes_per_block(hidden: int = 256, layers: int = 2, dtype_bytes: int = 2) -> int:
    """KV bytes of one block of the tiny model (K and V, every layer)."""
    return 2 * layers * CPU_BLOCK_TOKENS * hidden * dtype_bytes


def kv_transfer_config(
    *,
    policy: str,
    host_blocks: int,
    spec: str = "TenureCPUOffloadingSpec",
    push_addr: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An OffloadingConnector config whose host tier holds exactly ``host_blocks`` blocks."""
    config: dict[str, Any] = {
        "cpu_bytes_to_use": host_blocks * bytes_per_block(),
        "eviction_policy": policy,
        "spec_name": spec,
    }
    if push_addr:
        config["tenure_push_addr"] = push_addr
    config.update(extra or {})
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": config,
    }


def server_args(
    model: str, port: int, *, gpu_blocks: int, transfer: dict[str, Any], max_model_len: int = 1024
) -> list[str]:
    """Arguments of ``python -m vllm.entrypoints.openai.api_server`` for this engine."""
    return [
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "bfloat16",
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        "4",
        "--enforce-eager",
        "--num-gpu-blocks-override",
        str(gpu_blocks),
        "--served-model-name",
        "tiny",
        "--kv-transfer-config",
        json.dumps(transfer),
    ]


def apply_env() -> None:
    for key, value in CPU_ENGINE_ENV.items():
        os.environ.setdefault(key, value)
