"""Test helpers for a real in-process vLLM engine (assertions on what runs inside it)."""

from __future__ import annotations

from typing import Any

__all__ = ["live_manager"]


def live_manager(llm: Any) -> Any:
    """The offloading manager inside an in-process ``vllm.LLM`` (for assertions)."""
    core = llm.llm_engine.engine_core.engine_core
    return core.scheduler.connector.connector_scheduler.manager
