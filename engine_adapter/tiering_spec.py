"""vLLM's tiering offload (DRAM primary + secondary tiers), made to run on the CPU platform.

``TieringOffloadingSpec`` keeps the primary tier in a shared-memory region
(``SharedOffloadRegion``, ``/dev/shm``): the scheduler-side tiers read chunks from it (a
secondary tier's store copies a chunk's bytes out of it), the worker copies KV between the
engine and it. Its worker is the stock CUDA ``CPUOffloadingWorker``, which refuses the CPU
platform in ``get_worker`` ("CPU Offloading is currently only supported on CUDA-alike and XPU
GPUs"). That is the only obstacle: :class:`TenureCPUTieringSpec` overrides ``get_worker`` with
the host-copy worker of :mod:`tenure.engine_adapter.cpu_spec`, whose host pool is the shared
region's per-chunk views (exactly the layout ``CPUOffloadingWorker`` uses: one row per chunk, each
KV tensor's page at its offset), so the scheduler, the primary tier and every secondary tier are
the stock code. A test and CPU-deployment helper: on GPU hosts use ``TieringOffloadingSpec``.

Select it with ``"spec_name": "TenureCPUTieringSpec"`` (registered by the plugin) and the
stock ``secondary_tiers`` list, e.g. ``[{"type": "tenure-fs", "root_dir": ...}]``.
"""

from __future__ import annotations

import torch
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from tenure.engine_adapter.cpu_spec import HostCopyWorker
from tenure.engine_adapter.vllm_compat import engine_id

__all__ = ["SharedRegionHostCopyWorker", "TenureCPUTieringSpec"]


class SharedRegionHostCopyWorker(HostCopyWorker):
    """The host-copy worker with its host pool in the tiering spec's shared region."""

    def __init__(
        self, kv_caches: CanonicalKVCaches, region: SharedOffloadRegion, blocks_per_chunk: int
    ) -> None:
        self._region: SharedOffloadRegion | None = region
        super().__init__(kv_caches, region.num_chunks, blocks_per_chunk)

    def _host_pool(self, num_chunks: int, page: int) -> torch.Tensor:
        # The shared region's per-chunk view of this tensor (what the secondary tiers read).
        assert self._region is not None
        return self._region.create_next_worker_view(page)

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
                engine_id=engine_id(self),
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
