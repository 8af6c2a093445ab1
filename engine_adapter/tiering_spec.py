"""vLLM's tiering offload (DRAM primary + secondary tiers), made to run on the CPU platform.

``TieringOffloadingSpec`` keeps the primary tier in a shared-memory region
(``SharedOffloadRegion``, ``/dev/shm``): the scheduler-side tiers read chunks from it (a
secondary tier's store copies a chunk's bytes out of it), the worker copies KV between the
engine and it. Its worker is the stock CUDA ``CPUOffloadingWorker``, which refuses the CPU
platform in ``get_worker`` ("CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs"). That is the only obstacle: :class:`TenureCPUTieringSpec` overrides ``get_worker`` with
the host-copy worker of :mod:`engine_adapter.cpu_spec`, whose host pool is the shared region's
per-chunk views (exactly the layout ``CPUOffloadingWorker`` uses: one row per chunk, each KV
tensor's page at its offset), so the scheduler, the primary tier and every secondary tier are
the stock code. A test and CPU-deployment helper: on GPU hosts use ``TieringOffloadingSpec``.

Select it with ``"spec_name": "TenureCPUTieringSpec"`` (registered by the plugin) and the
stock ``secondary_tiers`` list, e.g. ``[{"type": "tenure-fs", "root_dir": ...}]``.
"""

from __future__ import annotations

import torch
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from engine_adapter.cpu_spec import HostCopyWorker

__all__ = ["SharedRegionHostCopyWorker", "TenureCPUTieringSpec"]


class SharedRegionHostCopyWorker(HostCopyWorker):
    """The host-copy worker with its host pool in the tiering spec's shared region."""

    def __init__(
        self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion, blocks_per_chunk: int
    ) -> None:
        if blocks_per_chunk != 1:
            raise ValueError(
                f"the host-copy worker needs blocks_per_chunk == 1, got {blocks_per_chunk}; "
                "set the offloaded block_size equal to the engine's block size"
            )
        self._engine: list[torch.Tensor] = []
        self._host: list[torch.Tensor] = []
        for entry in kv_caches.tensors:
            page = entry.page_size_bytes
            engine_view = entry.tensor.view(torch.int8).view(-1, page)
            if engine_view.device.type != "cpu":
                raise ValueError("the host-copy worker runs only where KV tensors are on the host")
            self._engine.append(engine_view)
            self._host.append(region.create_next_worker_view(page * blocks_per_chunk))
        self._finished = []
        self._region: SharedOffloadRegion | None = region

    def shutdown(self) -> None:
        self._host.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None


class TenureCPUTieringSpec(TieringOffloadingSpec):
    """``TieringOffloadingSpec`` whose worker copies on the host (vLLM's CPU platform)."""

    _host_worker: SharedRegionHostCopyWorker | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._host_worker is None:
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=0,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                self._host_worker = SharedRegionHostCopyWorker(
                    kv_caches, region, self.blocks_per_chunk
                )
            except Exception:
                region.cleanup()
                raise
        return self._host_worker
