"""Trace loaders: every format becomes one :class:`~tenure.service.replay.model.Trace`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tenure.service.errors import TraceError
from tenure.service.replay.loaders.canonical import FORMAT_NAME, load_canonical, write_canonical
from tenure.service.replay.loaders.claude_code import load_claude_code
from tenure.service.replay.loaders.mooncake import load_mooncake
from tenure.service.replay.model import Trace

__all__ = ["FORMATS", "TraceError", "detect_format", "load_trace", "write_canonical"]

FORMATS: dict[str, Callable[[Path], Trace]] = {
    "claude-code": load_claude_code,
    "mooncake": load_mooncake,
    "canonical": load_canonical,
}


def detect_format(path: Path) -> str:
    """Guess the format from the first line's keys (``--format`` overrides)."""
    from tenure.service.replay.loaders._io import json_lines

    for _line, obj in json_lines(path):
        if obj.get("format") == FORMAT_NAME:
            return "canonical"
        if "hash_ids" in obj and "timestamp" in obj:
            return "mooncake"
        if "requests" in obj and "block_size" in obj:
            return "claude-code"
        break
    raise TraceError(f"{path}: cannot tell the trace format; pass --format")


def load_trace(path: Path, fmt: str | None = None) -> Trace:
    if fmt is None:
        fmt = detect_format(path)
    loader = FORMATS.get(fmt)
    if loader is None:
        raise TraceError(f"unknown trace format {fmt!r}; valid: {', '.join(FORMATS)}")
    return loader(path)
