"""Where the bundled public traces live: ``../shared/traces`` beside the repository.

``TENURE_SHARED_DIR`` overrides the shared directory (the folder that holds ``traces/``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["claude_code_trace", "mooncake_trace", "shared_dir"]


def shared_dir() -> Path:
    override = os.environ.get("TENURE_SHARED_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / ".." / "shared"


def claude_code_trace() -> Path:
    return shared_dir() / "traces" / "claude_code" / "sessions.jsonl.gz"


def mooncake_trace() -> Path:
    return shared_dir() / "traces" / "mooncake" / "synthetic_trace.jsonl.gz"
