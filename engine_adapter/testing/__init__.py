"""Helpers for tests only (imported by ``tests/`` and the vLLM offloading-test shim, never by
the product): the adapter contract checks and access to a live engine's manager."""

__all__: list[str] = []
