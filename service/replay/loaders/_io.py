"""Reading trace files line by line with errors that name the file and line."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tenure.service.errors import TraceError

__all__ = ["json_lines", "require"]


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
