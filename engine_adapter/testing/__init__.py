"""Helpers for tests, benchmarks and ``tenure up``: the tiny model and CPU engine settings."""

__all__: list[str] = []
