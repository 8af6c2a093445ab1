"""How the stacks launch their two kinds of project process: a CPU vLLM server (with the
adapter's kv-transfer config in its arguments) and a ``tenure serve`` sidecar.

One place for each command line and environment, shared by :class:`~tenure.service.stack.LocalStack`
(``tenure up``), :class:`~tenure.service.stack.multi.MultiStack` (the scaled-out soak) and the live
A/B's stack; each returns a :class:`~tenure.service.processes.ManagedProcess` (its own process group
and log, stopped TERM then KILL).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tenure.service.processes import ManagedProcess, http_ok

__all__ = ["TENURE_ARGV", "VLLM_SERVER", "engine_process", "sidecar_process", "start_sidecar"]

#: ``tenure ...`` with this interpreter (the console script may not be on PATH).
TENURE_ARGV = [
    sys.executable,
    "-c",
    "import sys; from tenure.service.cli import main; sys.exit(main())",
]
#: vLLM's OpenAI-compatible server, with this interpreter.
VLLM_SERVER = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


def engine_process(name: str, args: list[str], log_path: Path) -> ManagedProcess:
    """A CPU vLLM server with ``args`` (not started yet)."""
    from tenure.engine_adapter.cpu_engine import CPU_ENGINE_ENV

    # EngineCore in its own process, as in production (a test process may have set the
    # in-process mode for its own engines).
    env = {**CPU_ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    return ManagedProcess(name, [*VLLM_SERVER, *args], log_path, env=env)


def sidecar_process(name: str, port: int, env: dict[str, str], log_path: Path) -> ManagedProcess:
    """``tenure serve --dev`` on ``port`` with the ``TENURE_*`` settings in ``env`` (not
    started yet)."""
    argv = [*TENURE_ARGV, "serve", "--dev", "--port", str(port), "--log-level", "warning"]
    return ManagedProcess(name, argv, log_path, env={"TENURE_DEV_MODE": "true", **env})


def start_sidecar(
    name: str, port: int, env: dict[str, str], log_path: Path, *, timeout: float = 60.0
) -> ManagedProcess:
    """:func:`sidecar_process`, started and answering ``/healthz``."""
    process = sidecar_process(name, port, env, log_path)
    process.start().wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), timeout)
    return process
