"""The canonical session format (``tenure-sessions`` v1): see ``service/replay/FORMAT.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tenure.service.errors import TraceError
from tenure.service.replay.loaders._io import json_lines, require
from tenure.service.replay.model import (
    BlockIdRun,
    SegmentBuilder,
    SegmentTable,
    Session,
    Trace,
    Turn,
)

__all__ = ["FORMAT_NAME", "load_canonical", "write_canonical"]

FORMAT_NAME = "tenure-sessions"
_SCOPES = ("root", "global")


def _blocks(value: Any, where: str) -> list[BlockIdRun]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: 'blocks' must be a list of [first_id, count]")
    out: list[BlockIdRun] = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or item[1] < 0
        ):
            raise TraceError(f"{where}: bad blocks entry {item!r}")
        if item[1]:
            out.append((item[0], item[1]))
    return out


def _nonneg(obj: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    if default is not None and key not in obj:
        return default
    value = require(obj, key, (int, float), where)
    if value != value or value < 0:
        raise TraceError(f"{where}: field {key!r} must be a non-negative number")
    return float(value)


def load_canonical(path: Path) -> Trace:
    lines = json_lines(path)
    header = next(lines, None)
    if header is None:
        raise TraceError(f"{path}: empty file (expected a {FORMAT_NAME} header line)")
    line_no, head = header
    where = f"{path}:{line_no}"
    if head.get("format") != FORMAT_NAME:
        raise TraceError(f'{where}: first line must be the header {{"format": "{FORMAT_NAME}"}}')
    if head.get("version") != 1:
        raise TraceError(f"{where}: unsupported version {head.get('version')!r} (expected 1)")
    block_tokens = require(head, "block_tokens", int, where)
    if block_tokens <= 0:
        raise TraceError(f"{where}: block_tokens must be positive")
    scope = head.get("id_scope", "root")
    if scope not in _SCOPES:
        raise TraceError(f"{where}: id_scope must be one of {', '.join(_SCOPES)}")

    trace = Trace(name=path.name, block_tokens=block_tokens)
    table = SegmentTable(trace.segment_owner)
    global_builder = SegmentBuilder(table)
    builders: dict[int, SegmentBuilder] = {}  # root session -> its id space
    index_of: dict[str, int] = {}
    root_of: list[int] = []
    for line_no, obj in lines:
        where = f"{path}:{line_no}"
        sid = require(obj, "id", str, where)
        if sid in index_of:
            raise TraceError(f"{where}: duplicate session id {sid!r}")
        index = len(trace.sessions)
        parent_id = obj.get("parent")
        parent: int | None = None
        spawn_after = -1
        join: tuple[int, float] | None = None
        if parent_id is not None:
            if not isinstance(parent_id, str) or parent_id not in index_of:
                raise TraceError(f"{where}: parent {parent_id!r} must name an earlier session")
            parent = index_of[parent_id]
            spawn_after = obj.get("spawn_after_turn", -1)
            if (
                isinstance(spawn_after, bool)
                or not isinstance(spawn_after, int)
                or spawn_after < -1
            ):
                raise TraceError(f"{where}: 'spawn_after_turn' must be an integer >= -1")
            if spawn_after >= len(trace.sessions[parent].turns):
                raise TraceError(f"{where}: 'spawn_after_turn' is past the parent's last turn")
            raw_join = obj.get("join")
            if raw_join is not None:
                if not isinstance(raw_join, dict):
                    raise TraceError(f"{where}: 'join' must be an object or null")
                join = (int(_nonneg(raw_join, "turn", where)), _nonneg(raw_join, "gap_s", where))
        root = index if parent is None else root_of[parent]
        if scope == "global":
            builder = global_builder
        else:
            builder = builders.setdefault(root, SegmentBuilder(table))
        raw_turns = require(obj, "turns", list, where)
        if not raw_turns:
            raise TraceError(f"{where}: session {sid!r} has no turns")
        turns: list[Turn] = []
        for k, raw in enumerate(raw_turns):
            w = f"{where} turn {k}"
            if not isinstance(raw, dict):
                raise TraceError(f"{w}: expected an object")
            n_in = int(_nonneg(raw, "input_tokens", w))
            n_out = int(_nonneg(raw, "output_tokens", w))
            gap = _nonneg(raw, "gap_s", w, default=0.0)
            stop = raw.get("stop", "unknown")
            if not isinstance(stop, str):
                raise TraceError(f"{w}: 'stop' must be a string")
            context, seen = builder.resolve(_blocks(raw.get("blocks", []), w), index)
            if sum(r.stop - r.start for r in context) * block_tokens > n_in:
                raise TraceError(f"{w}: more blocks than input tokens")
            hints = raw.get("hints") or {}
            if not isinstance(hints, dict):
                raise TraceError(f"{w}: 'hints' must be an object")
            likely_end = hints.get("likely_end", False) is True
            turns.append(
                Turn(gap, context, n_in, n_out, stop, seen, k == len(raw_turns) - 1, likely_end)
            )
        index_of[sid] = index
        root_of.append(root)
        trace.sessions.append(Session(sid, tuple(turns), parent, spawn_after, join))
    if not trace.sessions:
        raise TraceError(f"{path}: no sessions after the header")
    return trace


def write_canonical(trace: Trace, path: Path) -> None:
    """Write ``trace`` in the canonical format (global id scope: one id range per segment)."""
    base: list[int] = []
    next_id = 1
    lengths = [0] * len(trace.segment_owner)
    for session in trace.sessions:
        for turn in session.turns:
            for run in turn.context:
                lengths[run.seg] = max(lengths[run.seg], run.stop)
    for n in lengths:
        base.append(next_id)
        next_id += n
    with path.open("w", encoding="utf-8") as out:
        header = {"format": FORMAT_NAME, "version": 1, "block_tokens": trace.block_tokens}
        out.write(json.dumps({**header, "id_scope": "global"}) + "\n")
        for session in trace.sessions:
            obj: dict[str, Any] = {"id": session.id}
            if session.parent is not None:
                obj["parent"] = trace.sessions[session.parent].id
                obj["spawn_after_turn"] = session.spawn_after
                if session.join is not None:
                    obj["join"] = {"turn": session.join[0], "gap_s": session.join[1]}
            obj["turns"] = [
                {
                    "gap_s": t.gap_s,
                    "blocks": [[base[r.seg] + r.start, r.stop - r.start] for r in t.context],
                    "input_tokens": t.input_tokens,
                    "output_tokens": t.output_tokens,
                    "stop": t.stop,
                }
                for t in session.turns
            ]
            out.write(json.dumps(obj, separators=(",", ":")) + "\n")
