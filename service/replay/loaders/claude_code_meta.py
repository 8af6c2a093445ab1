"""Per-call and per-spawn metadata of the Claude Code trace that the replay model leaves out.

:func:`~tenure.service.replay.loaders.claude_code.load_claude_code` keeps what the engine model
needs (blocks, tokens, gaps). Placement also needs, per call, whether the model emitted reasoning
(``output_types`` containing ``thinking``) and its output size, and, per sub-agent, the spawn
metadata the worker ranker learns from. This module reads the same file and names sessions the
way the loader does (a root by its ``id``, a sub-agent as ``<parent id>/<agent_id>``; sub-agents
that never called the model are skipped), so its records line up with the loaded trace's
sessions and turns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tenure.service.errors import TraceError
from tenure.service.policy.ranker import SpawnRecord
from tenure.service.policy.ranker_fit import LabeledSpawn
from tenure.service.policy.spawn_context import ParentCall, history_at, human_turn, parent_features
from tenure.service.replay.loaders._io import json_lines, require

__all__ = ["CallMeta", "TraceMeta", "load_claude_code_meta"]

_CALLS = frozenset({"n", "s"})


@dataclass(frozen=True, slots=True)
class CallMeta:
    """One LLM call (a turn of the replay model)."""

    output_tokens: int
    output_types: tuple[str, ...]
    stop: str
    model: str

    @property
    def thinking(self) -> bool:
        return "thinking" in self.output_types

    @property
    def visible_types(self) -> tuple[str, ...]:
        """The output kinds besides reasoning (``text``, ``tool_use``), sorted."""
        return tuple(sorted(t for t in self.output_types if t != "thinking"))


@dataclass(slots=True)
class TraceMeta:
    #: Session id -> its calls, in turn order.
    calls: dict[str, list[CallMeta]] = field(default_factory=dict)
    #: Every sub-agent with its spawn record and recorded lifetime (root session = CV group).
    spawns: list[LabeledSpawn] = field(default_factory=list)
    #: Sub-agent session id -> sub-agent type.
    subagent_types: dict[str, str] = field(default_factory=dict)


def _has_calls(requests: list[Any]) -> bool:
    return any(isinstance(r, dict) and r.get("type") in _CALLS for r in requests)


def _int(req: dict[str, Any], key: str) -> int:
    value = req.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return int(value)
    return 0


def _float(req: dict[str, Any], key: str) -> float:
    value = req.get(key)
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return 0.0


def _types(req: dict[str, Any], key: str) -> tuple[str, ...]:
    value = req.get(key)
    return tuple(str(t) for t in value) if isinstance(value, list) else ()


def _lifetime_s(entry: dict[str, Any], inner: list[Any]) -> float:
    duration = entry.get("duration_ms")
    if isinstance(duration, int | float) and not isinstance(duration, bool) and duration >= 0:
        return float(duration) / 1000.0
    # Background agents record no duration: their last call's end is the best lower bound.
    ends = [
        float(r.get("t", 0.0)) + float(r.get("api_time", 0.0) or 0.0)
        for r in inner
        if isinstance(r, dict) and r.get("type") in _CALLS
    ]
    return max(ends) if ends else 0.0


def _spawned_at(entry: dict[str, Any]) -> float:
    """When a sub-agent was spawned (seconds since its session started).

    A sub-agent entry's ``t`` is when its tool call *returned*: for a completed agent that is
    its end (``t - duration_ms`` lands 0.1-1.0 s after the preceding parent call ended for 35
    of the trace's 37 completed sub-agents, and a fan-out's siblings share it), for a
    background agent (``async_launched``, no duration) its launch. A spawn record holds only
    what was known at the spawn, so the spawn time is ``t - duration``.
    """
    t = _float(entry, "t")
    duration = entry.get("duration_ms")
    if isinstance(duration, int | float) and not isinstance(duration, bool) and duration >= 0:
        return max(0.0, t - float(duration) / 1000.0)
    return t


class _Reader:
    def __init__(self, meta: TraceMeta) -> None:
        self.meta = meta

    def session(self, sid: str, root: str, requests: list[Any], where: str) -> None:
        calls: list[CallMeta] = []
        last_call: dict[str, Any] = {}
        group: list[tuple[str, dict[str, Any], list[Any]]] = []
        pending: list[tuple[str, list[Any], str]] = []
        earlier: list[tuple[float, float]] = []  # (spawn t, lifetime s) of this session's workers

        def flush_group() -> None:
            call = (
                None
                if not calls
                else ParentCall(
                    index=len(calls) - 1,
                    prompt_tokens=_int(last_call, "in"),
                    output_tokens=_int(last_call, "out"),
                    thinking="thinking" in _types(last_call, "output_types"),
                    human_turn=human_turn(_types(last_call, "input_types")),
                    gap_s=_float(last_call, "think_time"),
                )
            )
            # The trace lists a fan-out's siblings in the order they returned, which a spawn
            # cannot know: order them by spawn time (to the millisecond), then by agent id.
            ordered = sorted(group, key=lambda g: (round(_spawned_at(g[1]), 3), g[0]))
            for index, (child, entry, inner) in enumerate(ordered):
                lifetime = _lifetime_s(entry, inner)
                at = _spawned_at(entry)
                models = entry.get("models") or []
                first = next(r for r in inner if isinstance(r, dict) and r.get("type") in _CALLS)
                record = SpawnRecord(
                    subagent_type=str(entry.get("subagent_type") or ""),
                    model=str(models[0]) if isinstance(models, list) and models else "",
                    context_tokens=_int(first, "in"),
                    tool_tokens=_int(entry, "tool_tokens"),
                    system_tokens=_int(entry, "system_tokens"),
                    background=entry.get("status") == "async_launched",
                    fanout=len(group),
                    sibling_index=index,
                    session_elapsed_s=at,
                    # The derivation the sidecar uses live (tenure.service.policy.spawn_context).
                    **parent_features(call, history_at(earlier, at)),
                )
                self.meta.spawns.append(LabeledSpawn(root, child, record, lifetime))
                earlier.append((at, lifetime))
                self.meta.subagent_types[child] = record.subagent_type
            group.clear()

        for k, req in enumerate(requests):
            w = f"{where} request {k}"
            if not isinstance(req, dict):
                raise TraceError(f"{w}: expected an object")
            kind = require(req, "type", str, w)
            if kind == "subagent":
                inner = require(req, "requests", list, w)
                if not _has_calls(inner):
                    continue
                agent = str(req.get("agent_id", f"agent{len(pending)}"))
                child = f"{sid}/{agent}"
                group.append((child, req, inner))
                pending.append((child, inner, w))
                continue
            if kind not in _CALLS:
                raise TraceError(f"{w}: unknown request type {kind!r}")
            flush_group()
            types = req.get("output_types") or []
            calls.append(
                CallMeta(
                    output_tokens=_int(req, "out"),
                    output_types=tuple(str(t) for t in types) if isinstance(types, list) else (),
                    stop=str(req.get("stop") or "unknown"),
                    model=str(req.get("model") or ""),
                )
            )
            last_call = req
        flush_group()
        self.meta.calls[sid] = calls
        for child, inner, w in pending:
            self.session(child, root, inner, w)


def load_claude_code_meta(path: Path) -> TraceMeta:
    meta = TraceMeta()
    reader = _Reader(meta)
    for line_no, obj in json_lines(path):
        where = f"{path}:{line_no}"
        sid = require(obj, "id", str, where)
        requests = require(obj, "requests", list, where)
        if not _has_calls(requests):
            continue
        reader.session(sid, sid, requests, where)
    return meta
