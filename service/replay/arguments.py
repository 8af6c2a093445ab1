"""Checking the replay commands' arguments (numbers, output paths, the trace), with one-line
usage errors."""

from __future__ import annotations

import math
from pathlib import Path

from tenure.service.errors import TraceError, UsageError

__all__ = ["claude_code_trace", "int_list", "number", "output_dirs"]


def number(text: str, name: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if math.isnan(value) or math.isinf(value) or value < 0 or (positive and value == 0):
        kind = "positive" if positive else "non-negative"
        raise UsageError(f"{name} must be a {kind} number, got {text!r}")
    return value


def int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(
            f"{name} must be a comma-separated list of integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"{name} must list non-negative integers, got {text!r}")
    return values


def output_dirs(*outputs: Path | None) -> None:
    """Each output file given can be written: its directory exists (checked before any work)."""
    for out in outputs:
        if out is not None and not out.parent.is_dir():
            raise UsageError(f"{out}: the directory {out.parent} does not exist")


def claude_code_trace(path: Path, needs: str) -> None:
    """``path`` is a trace file in the Claude Code format; ``needs`` ends the error otherwise
    (what the command reads from that format)."""
    from tenure.service.replay.loaders import detect_format

    if not path.is_file():
        raise UsageError(f"{path}: no such trace file")
    try:
        if detect_format(path) != "claude-code":
            raise UsageError(f"{path}: {needs}")
    except TraceError as exc:
        raise UsageError(str(exc)) from None
