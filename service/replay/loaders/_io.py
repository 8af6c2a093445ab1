"""Reading trace files line by line with errors that name the file and line."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenure.service.errors import TraceError
from tenure.service.replay.model import BlockIdRun

__all__ = ["block_runs", "json_lines", "nonneg_number", "require"]


def _open_text(path: Path) -> Any:
    with path.open("rb") as probe:
        magic = probe.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line_number, object)`` for each non-empty line; gzip or plain text."""
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    line_no = 0
    try:
        with _open_text(path) as handle:
            for line_no, line in enumerate(handle, start=1):
                text = line.strip()
                if not text:
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{path}:{line_no}: malformed JSON ({exc.msg})") from None
                if not isinstance(obj, dict):
                    raise TraceError(f"{path}:{line_no}: expected a JSON object per line")
                yield line_no, obj
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as exc:
        raise TraceError(
            f"{path}:{line_no + 1}: truncated or corrupt file ({type(exc).__name__})"
        ) from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}:{line_no + 1}: not UTF-8 text") from None


def require(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[key]`` checked against ``kind`` (bools are not numbers here)."""
    if key not in obj:
        raise TraceError(f"{where}: missing field {key!r}")
    value = obj[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TraceError(f"{where}: field {key!r} has the wrong type")
    if not isinstance(value, kind):
        raise TraceError(f"{where}: field {key!r} has the wrong type")
    return value


def nonneg_number(
    obj: dict[str, Any],
    key: str,
    where: str,
    default: float | None = None,
    *,
    null_is_absent: bool = False,
) -> float:
    """``obj[key]`` as a non-negative float; ``default`` when the field is absent (or null,
    where the format writes null for unknown)."""
    if default is not None and (obj.get(key) is None if null_is_absent else key not in obj):
        return default
    value = require(obj, key, (int, float), where)
    if value != value or value < 0:
        raise TraceError(f"{where}: field {key!r} must be a non-negative number")
    return float(value)


def block_runs(value: Any, field: str, where: str) -> list[BlockIdRun]:
    """A ``[[first_id, count], ...]`` field as block-id runs (empty runs dropped)."""
    if not isinstance(value, list):
        raise TraceError(f"{where}: {field!r} must be a list of [first_id, count]")
    runs: list[BlockIdRun] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or item[1] < 0
        ):
            raise TraceError(f"{where}: bad {field} entry {item!r}")
        if item[1]:
            runs.append((item[0], item[1]))
    return runs
