"""Fixtures for tests that run a real vLLM engine (CPU build) with the Tenure adapter.

Engines are expensive on this 2-core machine, so one :class:`EngineSlot` per module keeps at
most one in-process engine alive and reuses it while consecutive tests ask for the same
configuration; between tests the engine's prefix cache and host tier are reset.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tenure.engine_adapter.cpu_engine import CPU_ENGINE_ENV, kv_transfer_config
from tenure.engine_adapter.testing.engine import live_manager
from tests.engine.router_peer import RouterPeer

GPU_BLOCKS = 6  # 5 usable blocks of 128 tokens: a few 300-token prompts flood it
HOST_BLOCKS = 6
MAX_MODEL_LEN = 512


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # vLLM and torch emit FutureWarnings on import and first use; they are not ours to fix.
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.filterwarnings("ignore::FutureWarning"))
            item.add_marker(pytest.mark.filterwarnings("ignore::UserWarning"))


def model_cache_dir() -> Path:
    return Path(os.environ.get("TENURE_CACHE_DIR", Path.home() / ".cache" / "tenure")) / "models"


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from tenure.service.tools.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model(model_cache_dir()))


@pytest.fixture(scope="session")
def engine_env() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in [*CPU_ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING"]}
    os.environ.update(CPU_ENGINE_ENV)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class EngineSlot:
    """At most one live in-process engine; ``get`` reuses it when the configuration matches."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.llm: Any = None
        self.key: tuple[Any, ...] | None = None

    def get(
        self,
        policy: str,
        *,
        spec: str = "TenureCPUOffloadingSpec",
        push_addr: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        key = (policy, spec, push_addr, tuple(sorted((extra or {}).items())))
        if self.llm is not None and key == self.key:
            self.llm.reset_prefix_cache(reset_connector=True)
            return self.llm
        self.close()
        from vllm import LLM
        from vllm.config import KVTransferConfig

        transfer = kv_transfer_config(
            policy=policy, host_blocks=HOST_BLOCKS, spec=spec, push_addr=push_addr, extra=extra
        )
        self.llm = LLM(
            model=self.model,
            dtype="bfloat16",
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=4,
            enforce_eager=True,
            num_gpu_blocks_override=GPU_BLOCKS,
            enable_prefix_caching=True,
            disable_log_stats=False,
            kv_transfer_config=KVTransferConfig(**transfer),
        )
        self.key = key
        return self.llm

    def close(self) -> None:
        if self.llm is None:
            return
        manager = live_manager(self.llm)
        client = getattr(manager, "push_client", None)
        if client is not None:
            client.stop()
        self.llm.llm_engine.engine_core.shutdown()
        self.llm = None
        self.key = None
        gc.collect()


@pytest.fixture(scope="module")
def engines(tiny_model: str, engine_env: None) -> Iterator[EngineSlot]:
    slot = EngineSlot(tiny_model)
    yield slot
    slot.close()


@pytest.fixture(scope="module")
def router() -> Iterator[RouterPeer]:
    peer = RouterPeer()
    yield peer
    peer.close()


# --- helpers used by the tests ------------------------------------------------------------------


def generate(llm: Any, prompt: str, tags: dict[str, Any] | None = None, max_tokens: int = 8):
    """Greedy tokens of one request, with ``tags`` as ``kv_transfer_params.tenure``."""
    from vllm import SamplingParams

    extra = {"kv_transfer_params": {"tenure": tags}} if tags is not None else None
    params = SamplingParams(temperature=0, max_tokens=max_tokens, extra_args=extra)
    out = llm.generate([prompt], params, use_tqdm=False)
    return list(out[0].outputs[0].token_ids)


def settle(llm: Any, until: Callable[[], bool] | None = None, timeout: float = 10.0) -> bool:
    """Step the engine the way its busy loop does while it has work (finished-request cleanup,
    pending timers), until ``until()`` holds or there is nothing left to do."""
    core = llm.llm_engine.engine_core.engine_core
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if until is not None and until():
            return True
        if core.scheduler.has_requests():
            core.step_fn()
        elif until is None:
            return True
        else:
            time.sleep(0.01)
    return until() if until is not None else False


def metric(llm: Any, name: str) -> float:
    total = 0.0
    for m in llm.get_metrics():
        if m.name == name and getattr(m, "value", None) is not None:
            total += m.value
    return total
