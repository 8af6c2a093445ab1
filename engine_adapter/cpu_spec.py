"""The stock CPU offloading path, made to run on vLLM's CPU platform.

vLLM's ``CPUOffloadingSpec`` refuses the CPU platform in ``get_worker`` (its worker drives CUDA
streams). :class:`CPUHostOffloadingSpec` overrides only ``get_worker`` with a synchronous
host-copy worker: the engine's KV "device" tensors already live in host memory, so a transfer is
one indexed copy per KV tensor. Everything scheduler-side (manager, cache policy, keys, chunk
pool) is the stock code, so a policy behaves here exactly as on a GPU host. A test and CPU
deployment helper: on GPUs use the stock spec (or :class:`TenureOffloadingSpec`) unchanged.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from tenure.engine_adapter.spec import TenureOffloadingSpec

__all__ = ["CPUHostOffloadingSpec", "HostCopyWorker", "TenureCPUOffloadingSpec"]


class HostCopyWorker(OffloadingWorker):
    """Copies whole KV blocks between the engine's host-resident KV tensors and a host pool.

    Transfers complete inside ``submit_*`` (there is no device to overlap with); results are
    handed back on the next ``get_finished`` as the scheduler expects.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, num_chunks: int, blocks_per_chunk: int):
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
            self._host.append(self._host_pool(num_chunks, page))
        self._finished: list[TransferResult] = []

    def _host_pool(self, num_chunks: int, page: int) -> torch.Tensor:
        """The host pool of one KV tensor: a row of ``page`` bytes per chunk."""
        return torch.zeros((num_chunks, page), dtype=torch.int8)

    def _copy(
        self,
        job_id: int,
        src: list[torch.Tensor],
        src_ids: Any,
        dst: list[torch.Tensor],
        dst_ids: Any,
    ) -> bool:
        start = time.perf_counter()
        src_index = torch.from_numpy(src_ids).to(torch.long)
        dst_index = torch.from_numpy(dst_ids).to(torch.long)
        if src_index.numel() != dst_index.numel():
            self._finished.append(TransferResult(job_id=job_id, success=False))
            return False
        moved = 0
        for s, d in zip(src, dst, strict=True):
            d.index_copy_(0, dst_index, s.index_select(0, src_index))
            moved += src_index.numel() * s.shape[1]
        self._finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=moved,
                transfer_time=time.perf_counter() - start,
            )
        )
        return True

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        assert isinstance(dst_spec, BlockIDsLoadStoreSpec)
        return self._copy(job_id, self._engine, src_spec.block_ids, self._host, dst_spec.block_ids)

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,  # vLLM 0.33: waited on within the step; copies are synchronous
    ) -> bool:
        assert isinstance(src_spec, BlockIDsLoadStoreSpec)
        return self._copy(job_id, self._host, src_spec.block_ids, self._engine, dst_spec.block_ids)

    def get_finished(self) -> list[TransferResult]:
        done, self._finished = self._finished, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        # Transfers are synchronous: anything submitted is already complete.
        return


class CPUHostOffloadingSpec(CPUOffloadingSpec):
    """Stock ``CPUOffloadingSpec`` (stock manager and policies) with the host-copy worker."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._host_worker is None:
            self._host_worker = HostCopyWorker(kv_caches, self.num_chunks, self.blocks_per_chunk)
        return self._host_worker

    _host_worker: HostCopyWorker | None = None


class TenureCPUOffloadingSpec(TenureOffloadingSpec):
    """:class:`TenureOffloadingSpec` (Tenure's manager) with the host-copy worker."""

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._host_worker is None:
            self._host_worker = HostCopyWorker(kv_caches, self.num_chunks, self.blocks_per_chunk)
        return self._host_worker

    _host_worker: HostCopyWorker | None = None
