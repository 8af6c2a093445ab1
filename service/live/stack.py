"""The A/B's stack: :class:`~tenure.service.stack.LocalStack` with the engine the slice needs.

Beside the local stack's own engine it sets the KV block size of the scaled trace, the pool and
host tier the sizing rule chose, the batch limits the simulator's CPU profile assumes, the tool
parser that lets ``tool_choice="required"`` run (vLLM refuses it without one; ``pythonic``
parses vLLM's own JSON-schema-constrained output, never the model's free text here), and the
host-tier policy of the arm:

* ``tenure`` (and every core policy): Tenure's manager and the core policy by name
  (``TenureCPUOffloadingSpec``), the push channel from the sidecar;
* ``lru`` with ``lru_impl="adapter"`` (the default): the core's ``lru`` behind the same manager
  (``tenure-lru``), which the differential test holds to vLLM's ``LRUCachePolicy`` block for
  block, so both arms run one code path and report the same counters;
* ``lru`` with ``lru_impl="stock"``: vLLM's own ``CPUOffloadingManager`` + ``LRUCachePolicy``
  (``CPUHostOffloadingSpec``), no Tenure code in the engine; it counts no evictions or
  refusals of its own.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenure.service.stack import LocalStack, StackConfig

__all__ = ["DTYPE", "ABStack", "ABStackConfig", "group_cpu_seconds", "kv_bytes_per_block"]

#: The A/B's engine computes in float32: this CPU has AVX2 but no AVX-512 BF16, and float32
#: measured 2-3x faster than bfloat16 here (prefill and decode both).
DTYPE = "float32"
_DTYPE_BYTES = 4


def group_cpu_seconds(groups: list[int]) -> float | None:
    """CPU seconds (user + system) used so far by the live processes of these process
    groups, from ``/proc``; ``None`` where there is no ``/proc`` (not Linux)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    wanted = set(groups)
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # The command name (field 2) may hold spaces; the fields after its ")" are fixed.
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) in wanted:  # pgrp
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def kv_bytes_per_block(block_tokens: int, layout: str = "tiny") -> int:
    """KV bytes of one engine block of the random-weight model ``layout`` (K and V, every
    layer; :mod:`tenure.service.tools.tiny_model`)."""
    from tenure.service.tools.tiny_model import layout_named

    return block_tokens * layout_named(layout).kv_bytes_per_token(_DTYPE_BYTES)


@dataclass
class ABStackConfig(StackConfig):
    block_tokens: int = 32
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    lru_impl: str = "adapter"
    #: vLLM's start measured past the stack's 240 s on this 2-core VM at load ~10 (other
    #: jobs' tests beside it): the A/B and the calibration wait longer.
    engine_timeout_s: float = 900.0
    #: Which random-weight model (:func:`tenure.service.tools.tiny_model.layout_named`).
    layout: str = "tiny"
    #: Core policy parameters for the adapter (the time constants of a compressed clock).
    policy_params: dict[str, float] = field(default_factory=dict)
    #: Extra ``TENURE_*`` settings of the sidecar (e.g. recording).
    sidecar_env: dict[str, str] = field(default_factory=dict)
    #: Run the model in the EngineCore process (vLLM's ``uni`` executor) instead of in a
    #: worker process of its own (``mp``, what the CPU platform picks): one Python process
    #: fewer to spawn and import torch and vLLM into at start (measured ~14 s of a ~45-65 s
    #: start on the loaded 2-core VM). ``tenure up --quick`` sets it for both arms.
    in_process_worker: bool = False
    #: Extra arguments of the vLLM server, after the ones above (e.g. a ``--generation-config``
    #: directory whose ``eos_token_id`` list makes the random model end its answers).
    engine_args: list[str] = field(default_factory=list)
    #: Extra environment of the vLLM server (e.g. ``VLLM_SERVER_DEV_MODE=1`` for its
    #: ``/reset_prefix_cache``).
    engine_env: dict[str, str] = field(default_factory=dict)
    #: CPUs the engine (its API server, EngineCore and worker, and their threads) may run on,
    #: with one torch thread per CPU; empty: all of them, torch's default thread count. Arms
    #: played side by side each get their own core, so neither engine's threads preempt the
    #: other's (a torch step waits on its slowest thread).
    engine_cpus: tuple[int, ...] = ()


class ABStack(LocalStack):
    config: ABStackConfig

    def __init__(self, config: ABStackConfig, progress: Any = None) -> None:
        super().__init__(config, progress)

    def ensure_model(self) -> Path:
        if self.config.model is not None or self.config.layout == "tiny":
            return super().ensure_model()
        from tenure.service.tools.tiny_model import ensure_tiny_model, layout_named

        self.progress(
            f"preparing the {self.config.layout} random-weight model in {self.config.model_cache}"
        )
        self.model_path = ensure_tiny_model(
            self.config.model_cache, layout_named(self.config.layout)
        )
        return self.model_path

    def engine_transfer_config(self) -> dict[str, Any]:
        cfg = self.config
        extra: dict[str, Any] = {
            "cpu_bytes_to_use": cfg.host_blocks * kv_bytes_per_block(cfg.block_tokens, cfg.layout),
        }
        if cfg.policy == "lru" and cfg.lru_impl == "stock":
            extra.update(eviction_policy="lru", spec_name="CPUHostOffloadingSpec")
        else:
            from tenure.engine_adapter.policy_names import vllm_name_for

            extra.update(
                eviction_policy=vllm_name_for(cfg.policy),
                spec_name="TenureCPUOffloadingSpec",
                tenure_push_addr=self.push_addr,
                tenure_report_interval_s=cfg.report_interval_s,
                tenure_hello_interval_s=cfg.hello_interval_s,
            )
            if cfg.policy_params:
                extra["tenure_policy_params"] = dict(cfg.policy_params)
        return {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": extra,
        }

    def engine_argv(self) -> list[str]:
        cfg = self.config
        assert self.model_path is not None
        return [
            "--model", str(self.model_path),
            "--host", "127.0.0.1",
            "--port", str(cfg.engine_port),
            "--dtype", DTYPE,
            "--max-model-len", str(cfg.max_model_len),
            "--max-num-seqs", str(cfg.max_num_seqs),
            "--max-num-batched-tokens", str(cfg.max_num_batched_tokens),
            "--enforce-eager",
            "--block-size", str(cfg.block_tokens),
            "--num-gpu-blocks-override", str(cfg.gpu_blocks),
            "--served-model-name", "tiny",
            "--enable-auto-tool-choice",
            # Each answer's usage then says how many of its prompt tokens came from a cache
            # (engine prefix cache or host tier): the A/B's per-call paired measure.
            "--enable-prompt-tokens-details",
            "--tool-call-parser", "pythonic",
            "--uvicorn-log-level", "warning",
            "--kv-transfer-config", json.dumps(self.engine_transfer_config()),
            *(("--distributed-executor-backend", "uni") if cfg.in_process_worker else ()),
            *cfg.engine_args,
        ]  # fmt: skip

    def engine_banner(self) -> str:
        return (
            f"starting vLLM (CPU) on {self.engine_url}: host tier {self.config.policy}, "
            f"pool {self.config.gpu_blocks} + host {self.config.host_blocks} blocks of "
            f"{self.config.block_tokens} tokens"
        )

    def sidecar_env(self) -> dict[str, str]:
        return {**super().sidecar_env(), **self.config.sidecar_env}

    # --- a start in two steps: launch every process, then wait for them ------------------

    def launch_engine(self) -> None:
        """Spawn the vLLM server (:meth:`wait_engine` waits until it answers)."""
        from tenure.service.stack.launch import engine_process

        if self.model_path is None:
            self.ensure_model()
        self.progress(self.engine_banner())
        self.engine = engine_process("vllm", self.engine_argv(), self.logs / "vllm.log")
        if self.config.in_process_worker:
            # The API server always runs EngineCore in a process of its own (AsyncLLM); the
            # CPU platform keeps the ``uni`` executor only where this is off (it forces a
            # worker process otherwise).
            self.engine.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if self.config.engine_cpus:
            self.engine.env["OMP_NUM_THREADS"] = str(len(self.config.engine_cpus))
        self.engine.env.update(self.config.engine_env)
        self.engine.start()
        if self.config.engine_cpus and self.engine.process is not None:
            # Set before the server spawns anything: EngineCore, the worker and every thread
            # inherit it.
            os.sched_setaffinity(self.engine.process.pid, self.config.engine_cpus)

    def wait_engine(self) -> None:
        from tenure.service.processes import http_ok

        assert self.engine is not None
        self.engine.wait_until(
            lambda: http_ok(f"{self.engine_url}/health"), self.config.engine_timeout_s
        )

    def start_engine(self) -> None:
        self.launch_engine()
        self.wait_engine()

    def launch_sidecar(self) -> None:
        from tenure.service.stack.launch import sidecar_process

        self.progress(f"starting the Tenure sidecar on {self.proxy_url}")
        self.sidecar = sidecar_process(
            "tenure serve", self.config.proxy_port, self.sidecar_env(), self.logs / "sidecar.log"
        )
        self.sidecar.start()

    def wait_sidecar(self) -> None:
        from tenure.service.processes import http_ok

        assert self.sidecar is not None
        self.sidecar.wait_until(lambda: http_ok(f"{self.proxy_url}/healthz"), 60)

    def launch(self) -> ABStack:
        """Spawn every component without waiting for the sidecar or the engine (Redis is
        waited for: the sidecar needs it at once); :meth:`wait_ready` finishes the start.

        The sidecar and the engine start side by side: the adapter's push channel connects
        whenever the sidecar binds it (ZeroMQ reconnects), so neither waits for the other.
        """
        self.config.workdir.mkdir(parents=True, exist_ok=True)
        try:
            if not self.config.external_redis_url:
                self.start_redis()
            self.ensure_model()
            self.launch_sidecar()
            self.launch_engine()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> ABStack:
        try:
            self.wait_sidecar()
            self.wait_engine()
            if self.uses_adapter:
                self.wait_for_adapter()
        except BaseException:
            self.stop()
            raise
        return self

    def start(self) -> ABStack:
        return self.launch().wait_ready()

    def process_groups(self) -> list[int]:
        """Process-group ids of the stack's running components (each runs in its own)."""
        return [
            p.process.pid
            for p in (self.redis, self.sidecar, self.engine)
            if p is not None and p.process is not None and p.running
        ]

    @property
    def uses_adapter(self) -> bool:
        return not (self.config.policy == "lru" and self.config.lru_impl == "stock")
