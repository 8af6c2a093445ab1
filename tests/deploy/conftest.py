"""Fixtures for deployment-file tests: the repo root and what the sidecar really exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[2]

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("_sum", "_count", ""),
    "gauge": ("",),
}


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def exported_series() -> frozenset[str]:
    """Every series name the sidecar's ``/metrics`` can carry, from its real metrics module."""
    from tenure.service.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return frozenset(names)
