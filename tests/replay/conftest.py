"""Fixtures for the replay tests: the real bundled traces, loaded once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tenure.service.replay.loaders import load_trace
from tenure.service.replay.loaders.claude_code_meta import TraceMeta, load_claude_code_meta
from tenure.service.replay.model import Trace
from tenure.service.replay.paths import claude_code_trace, mooncake_trace


@pytest.fixture(scope="session")
def claude_path() -> Path:
    path = claude_code_trace()
    if not path.is_file():
        pytest.fail(f"bundled trace missing: {path} (set TENURE_SHARED_DIR)")
    return path


@pytest.fixture(scope="session")
def mooncake_path() -> Path:
    path = mooncake_trace()
    if not path.is_file():
        pytest.fail(f"bundled trace missing: {path} (set TENURE_SHARED_DIR)")
    return path


@pytest.fixture(scope="session")
def claude(claude_path: Path) -> Trace:
    return load_trace(claude_path, "claude-code")


@pytest.fixture(scope="session")
def claude_small(claude: Trace) -> Trace:
    """A dozen sessions, two of them with sub-agents (root 0 holds the first sub-agents)."""
    return claude.subset(claude.roots[:12])


@pytest.fixture(scope="session")
def claude_meta(claude_path: Path) -> TraceMeta:
    """Per-call output types and sub-agent spawn records of the Claude Code trace."""
    return load_claude_code_meta(claude_path)
