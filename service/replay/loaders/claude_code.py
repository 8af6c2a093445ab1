"""The Claude Code trace format (``../shared/traces/claude_code/sessions.jsonl.gz``).

One session per line. Calls (``type`` ``n`` or ``s``) form the session's main chain; a
``subagent`` entry becomes a child session whose inner ``t`` counts from its spawn. Timing:

* a call's gap is its ``think_time`` (the client-side wait before it: the tool run or the
  human), so in the closed-loop replay the call arrives that long after the previous one
  completed;
* a child starts ``t_spawn - (t_prev + api_time_prev)`` after the parent call that precedes it
  completed, where ``t_spawn = t - duration_ms`` (a sub-agent entry's ``t`` is when it
  returned; a background one's, without a duration, when it was launched); the parent call
  that follows it waits for the child to finish (plus the recorded hand-back time) when the
  recording shows it did (the child ended, at ``t``, before that call started);
* block ids (``hash_runs``, run-length encoded) are local to a session and its sub-agents: one
  id space per root session.
"""

from __future__ import annotations

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

__all__ = ["load_claude_code"]

_CALL_TYPES = frozenset({"n", "s"})


def _hash_runs(req: dict[str, Any], where: str) -> list[BlockIdRun]:
    raw = req.get("hash_runs", [])
    if not isinstance(raw, list):
        raise TraceError(f"{where}: 'hash_runs' must be a list of [first_id, count]")
    runs: list[BlockIdRun] = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in item)
            or item[1] < 0
        ):
            raise TraceError(f"{where}: bad hash_runs entry {item!r}")
        if item[1]:
            runs.append((item[0], item[1]))
    return runs


def _number(req: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    if default is not None and req.get(key) is None:
        return default  # absent or null: unknown (e.g. an async sub-agent's duration)
    value = require(req, key, (int, float), where)
    if value != value or value < 0:
        raise TraceError(f"{where}: field {key!r} must be a non-negative number")
    return float(value)


class _Loader:
    def __init__(self, trace: Trace, table: SegmentTable) -> None:
        self.trace = trace
        self.table = table

    def session(
        self,
        sid: str,
        requests: list[Any],
        where: str,
        builder: SegmentBuilder,
        parent: int | None,
        spawn_after: int,
        spawn_gap: float,
        join: tuple[int, float] | None,
    ) -> None:
        index = len(self.trace.sessions)
        # Reserve the slot so children (appended later) can point at this session.
        self.trace.sessions.append(Session(sid, ()))
        turns: list[Turn] = []
        pending: list[tuple[str, list[Any], str, int, float, float]] = []
        prev_end: float | None = None  # recorded completion time of the previous call
        # Children spawned since the previous call: (end time, child slot in `pending`).
        since_prev: list[int] = []
        joins: dict[int, tuple[int, float]] = {}
        for k, req in enumerate(requests):
            w = f"{where} request {k}"
            if not isinstance(req, dict):
                raise TraceError(f"{w}: expected an object")
            kind = require(req, "type", str, w)
            t = _number(req, "t", w)
            if kind == "subagent":
                inner = require(req, "requests", list, w)
                if not _has_calls(inner):
                    continue  # a sub-agent that never called the model leaves no trace here
                agent = str(req.get("agent_id", f"agent{len(pending)}"))
                duration = _number(req, "duration_ms", w, default=-1.0)
                # The entry's ``t`` is when the sub-agent's tool call returned: for a finished
                # one its end, so it was spawned ``duration_ms`` earlier (that lands 0.1-1.0 s
                # after the preceding parent call ended for 35 of the trace's 37 finished
                # sub-agents); a background one (no duration) records its launch.
                start = max(0.0, t - duration / 1000.0) if duration >= 0 else t
                end = t if duration >= 0 else -1.0
                gap = start if prev_end is None else max(0.0, start - prev_end)
                pending.append((f"{sid}/{agent}", inner, w, len(turns) - 1, gap, end))
                since_prev.append(len(pending) - 1)
                continue
            if kind not in _CALL_TYPES:
                raise TraceError(f"{w}: unknown request type {kind!r}")
            tokens_in = int(_number(req, "in", w))
            tokens_out = int(_number(req, "out", w))
            stop = req.get("stop") or "unknown"
            if not isinstance(stop, str):
                raise TraceError(f"{w}: field 'stop' must be a string")
            think = _number(req, "think_time", w, default=0.0)
            api = _number(req, "api_time", w, default=0.0)
            context, seen = builder.resolve(_hash_runs(req, w), index)
            if sum(r.stop - r.start for r in context) * self.trace.block_tokens > tokens_in:
                raise TraceError(f"{w}: more blocks than input tokens")
            gap = 0.0 if not turns else think
            # The call after a sub-agent waits for it when the recording shows it did.
            for slot in since_prev:
                child_end = pending[slot][5]
                if turns and 0 <= child_end <= t + 1.0:
                    joins[slot] = (len(turns), max(0.0, t - child_end))
            since_prev = []
            turns.append(Turn(gap, context, tokens_in, tokens_out, stop, seen, False))
            prev_end = t + api
        if turns:
            last = turns[-1]
            turns[-1] = Turn(
                last.gap_s,
                last.context,
                last.input_tokens,
                last.output_tokens,
                last.stop,
                last.seen_blocks,
                True,
            )
        self.trace.sessions[index] = Session(sid, tuple(turns), parent, spawn_after, join)
        for slot, (child_id, inner, w, after, gap, _end) in enumerate(pending):
            self.session(child_id, inner, w, builder, index, after, gap, joins.get(slot))
        # A child's first call arrives `spawn_gap` after its spawn point.
        if parent is not None and turns:
            first = self.trace.sessions[index].turns[0]
            fixed = Turn(
                spawn_gap,
                first.context,
                first.input_tokens,
                first.output_tokens,
                first.stop,
                first.seen_blocks,
                first.last,
            )
            s = self.trace.sessions[index]
            self.trace.sessions[index] = Session(
                s.id, (fixed, *s.turns[1:]), s.parent, s.spawn_after, s.join
            )


def load_claude_code(path: Path, max_roots: int | None = None) -> Trace:
    """The trace; with ``max_roots``, only its first root sessions (and their sub-agents):
    block ids are local to a root session, so those come out exactly as in the whole trace."""
    trace = Trace(name=path.name, block_tokens=0)
    table = SegmentTable(trace.segment_owner)
    loader = _Loader(trace, table)
    roots = 0
    for line_no, obj in json_lines(path):
        if max_roots is not None and roots >= max_roots:
            break
        where = f"{path}:{line_no}"
        sid = require(obj, "id", str, where)
        block = require(obj, "block_size", int, where)
        if block <= 0:
            raise TraceError(f"{where}: block_size must be positive")
        if trace.block_tokens and block != trace.block_tokens:
            raise TraceError(f"{where}: block_size {block} differs from {trace.block_tokens}")
        trace.block_tokens = block
        requests = require(obj, "requests", list, where)
        if not _has_calls(requests):
            continue
        builder = SegmentBuilder(table)  # ids are local to a session and its sub-agents
        loader.session(sid, requests, where, builder, None, -1, 0.0, None)
        roots += 1
    if not trace.sessions:
        raise TraceError(f"{path}: no sessions in trace")
    return trace


def _has_calls(requests: list[Any]) -> bool:
    return any(isinstance(r, dict) and r.get("type") in _CALL_TYPES for r in requests)
