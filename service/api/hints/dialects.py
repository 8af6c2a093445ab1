"""Hint dialects of other serving stacks, read onto Tenure's hint model.

Harnesses built for another stack already say "this is session X, child of Y, keep it for N
seconds" in that stack's words; a harness that speaks one of these works with Tenure unchanged.
What each dialect carries, as its public docs and code define it:

* **NVIDIA Dynamo** (docs.nvidia.com/dynamo, "Session IDs" and "Agent Hints"; ai-dynamo/dynamo
  PR #6213 for ``nvext.cache_control``): headers ``X-Dynamo-Session-ID`` (session),
  ``X-Dynamo-Parent-Session-ID`` (parent), ``X-Dynamo-Session-Final: true`` (the session's last
  request); body ``nvext.cache_control = {"type": "ephemeral", "ttl": "5m"}`` (``"<N>s"``,
  ``"<N>m"``, ``"<N>h"``); ``nvext.agent_hints`` (``priority``, ``strict_priority``, ``osl``,
  ``speculative_prefill``, ``latency_sensitivity``) carries scheduling intent with no
  counterpart in Tenure: known fields are left alone, unknown ones counted.
* **vLLM's agent-hint RFC** (vllm-project/vllm#52113): body ``agent_hint = {"session_id",
  "parent_session_id", "cache_control": {"type": "ephemeral", "ttl": <seconds, 0..3600>}}``
  (``context_management`` is the engine's own business: left alone).
* **OpenAI** ``prompt_cache_key`` (a body string the harness keeps stable per conversation).
* **llm-d** ``x-session-token`` (llm-d-inference-scheduler, the session-affinity scorer): an
  opaque token the scheduler hands out in a response header and the client echoes on the
  next request. It names the client's affinity, so a client that reuses one token for several
  conversations merges them: it ranks last.

Precedence, highest first, field by field (``session``, ``parent``, ``last_turn``,
``retention_s``): Tenure's own hints (``X-Tenure-*`` / ``tenure``), Dynamo, the vLLM RFC, the
route's own session keys (``metadata.user_id`` on ``/v1/messages``; ``conversation`` on
``/v1/responses``), ``prompt_cache_key``, llm-d's token; a session named by none of them is
inferred (chat and messages) or chained (responses). A lower source that disagrees with a
higher one is overridden and counted, never an error: harness stacks often send two dialects.

Dialect fields are other stacks' extensions, so a malformed or unknown one is ignored and
counted (``tenure_dialect_fields_total``, labels from a fixed set), never an error and never a
Tenure hint. The fields stay in the forwarded body: they are the engine's to read or ignore.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tenure.service.api.hints.tenure import MAX_GAP_S, Hints

__all__ = [
    "DIALECT_BODY_KEYS",
    "DIALECT_FIELDS",
    "DialectReading",
    "Found",
    "apply",
    "has_dialect_headers",
    "read",
    "retention_seconds",
    "session_key",
]

DYNAMO_SESSION = "x-dynamo-session-id"
DYNAMO_PARENT = "x-dynamo-parent-session-id"
DYNAMO_FINAL = "x-dynamo-session-final"
LLMD_TOKEN = "x-session-token"
DIALECT_HEADERS = frozenset({DYNAMO_SESSION, DYNAMO_PARENT, DYNAMO_FINAL, LLMD_TOKEN})
#: Body keys whose presence means a dialect may be speaking (one dict lookup each).
DIALECT_BODY_KEYS = ("nvext", "agent_hint", "prompt_cache_key")

#: Every (dialect, field) label pair the counter may carry: client text never becomes a label.
DIALECT_FIELDS: frozenset[tuple[str, str]] = frozenset(
    {
        ("dynamo", "x-dynamo-session-id"),
        ("dynamo", "x-dynamo-parent-session-id"),
        ("dynamo", "x-dynamo-session-final"),
        ("dynamo", "nvext"),
        ("dynamo", "nvext.cache_control"),
        ("dynamo", "nvext.agent_hints"),
        ("dynamo", "unknown"),
        ("vllm", "agent_hint"),
        ("vllm", "agent_hint.session_id"),
        ("vllm", "agent_hint.parent_session_id"),
        ("vllm", "agent_hint.cache_control"),
        ("vllm", "unknown"),
        ("openai", "prompt_cache_key"),
        ("llm-d", "x-session-token"),
        ("route", "session"),
        ("route", "retention_s"),
    }
)

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
#: Longest foreign session key accepted (hashed into an id when it is not one already).
_MAX_KEY = 1024
_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_DYNAMO_AGENT_HINTS = frozenset(
    {"priority", "strict_priority", "osl", "speculative_prefill", "latency_sensitivity"}
)
_NVEXT_KNOWN = frozenset({"agent_hints", "cache_control"})
_AGENT_HINT_KNOWN = frozenset(
    {"session_id", "parent_session_id", "cache_control", "context_management"}
)
_CACHE_CONTROL_KNOWN = frozenset({"type", "ttl", "block_offset"})
_FIELDS = ("session", "parent", "last_turn", "retention_s")


def session_key(value: object) -> str | None:
    """A foreign session key as a Tenure session id; None if it is not a usable key.

    A key that is already a valid id is kept as it is (so the same logical session reads the
    same in every dialect); any other string of at most 1,024 characters maps to
    ``k-<digest>``, the same id every time. Tenant scoping happens later, as for every id.
    """
    if not isinstance(value, str) or not value or len(value) > _MAX_KEY:
        return None
    if _ID.match(value):
        return value
    return "k-" + hashlib.blake2b(value.encode("utf-8", "replace"), digest_size=12).hexdigest()


def retention_seconds(value: object) -> float | None:
    """A cache TTL as seconds: a number (the vLLM RFC), or ``"5m"``/``"1h"``/``"300s"``/``"300"``
    (Anthropic, Dynamo); None if malformed, negative or over 30 days."""
    seconds: float
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            return None
    elif isinstance(value, str) and len(value) <= 32:
        match = _TTL.match(value)
        if match is None:
            return None
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
    else:
        return None
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_GAP_S:
        return None
    return seconds


@dataclass(frozen=True, slots=True)
class Found:
    """What one source says (None: nothing)."""

    session: str | None = None
    parent: str | None = None
    last_turn: bool | None = None
    retention_s: float | None = None


NOTHING = Found()


@dataclass(slots=True)
class DialectReading:
    """Every dialect's reading of one request, and what the counter must record."""

    #: In precedence order: (dialect, what it says).
    sources: list[tuple[str, Found]] = field(default_factory=list)
    #: (dialect, field, outcome) with outcome ``ignored`` (malformed) or ``unknown``.
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def skip(self, dialect: str, name: str, outcome: str = "ignored") -> None:
        label = name if (dialect, name) in DIALECT_FIELDS else "unknown"
        self.events.append((dialect, label, outcome))


def has_dialect_headers(headers: Mapping[str, str]) -> bool:
    return any(name in headers for name in DIALECT_HEADERS)


def _bool(value: str) -> bool | None:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    return None


def _cache_control_ttl(
    reading: DialectReading, dialect: str, name: str, obj: object
) -> float | None:
    if not isinstance(obj, dict):
        reading.skip(dialect, name)
        return None
    if set(obj) - _CACHE_CONTROL_KNOWN:
        reading.skip(dialect, "unknown", "unknown")
    kind = obj.get("type", "ephemeral")
    if kind != "ephemeral":
        reading.skip(dialect, name)
        return None
    if "ttl" not in obj:
        # Anthropic's and the RFC's default: five minutes.
        return 300.0
    ttl = retention_seconds(obj["ttl"])
    if ttl is None:
        reading.skip(dialect, name)
    return ttl


def _dynamo(headers: Mapping[str, str], payload: Mapping[str, Any], r: DialectReading) -> Found:
    session = parent = None
    last: bool | None = None
    retention: float | None = None
    raw = headers.get(DYNAMO_SESSION)
    if raw is not None:
        session = session_key(raw)
        if session is None:
            r.skip("dynamo", DYNAMO_SESSION)
    raw = headers.get(DYNAMO_PARENT)
    if raw is not None:
        parent = session_key(raw)
        if parent is None:
            r.skip("dynamo", DYNAMO_PARENT)
    raw = headers.get(DYNAMO_FINAL)
    if raw is not None:
        last = _bool(raw)
        if last is None:
            r.skip("dynamo", DYNAMO_FINAL)
    nvext = payload.get("nvext")
    if nvext is not None:
        if not isinstance(nvext, dict):
            r.skip("dynamo", "nvext")
        else:
            if set(nvext) - _NVEXT_KNOWN:
                r.skip("dynamo", "unknown", "unknown")
            if "cache_control" in nvext:
                retention = _cache_control_ttl(
                    r, "dynamo", "nvext.cache_control", nvext["cache_control"]
                )
            hints = nvext.get("agent_hints")
            if hints is not None and not isinstance(hints, dict):
                r.skip("dynamo", "nvext.agent_hints")
            elif isinstance(hints, dict) and set(hints) - _DYNAMO_AGENT_HINTS:
                r.skip("dynamo", "unknown", "unknown")
    return Found(session, parent, last, retention)


def _vllm(payload: Mapping[str, Any], r: DialectReading) -> Found:
    hint = payload.get("agent_hint")
    if hint is None:
        return NOTHING
    if not isinstance(hint, dict):
        r.skip("vllm", "agent_hint")
        return NOTHING
    if set(hint) - _AGENT_HINT_KNOWN:
        r.skip("vllm", "unknown", "unknown")
    session = parent = None
    retention: float | None = None
    if "session_id" in hint:
        session = session_key(hint["session_id"])
        if session is None:
            r.skip("vllm", "agent_hint.session_id")
    if "parent_session_id" in hint:
        parent = session_key(hint["parent_session_id"])
        if parent is None:
            r.skip("vllm", "agent_hint.parent_session_id")
    if hint.get("cache_control") is not None:
        retention = _cache_control_ttl(r, "vllm", "agent_hint.cache_control", hint["cache_control"])
        if retention is not None and retention > 3600:  # the RFC's own bound
            r.skip("vllm", "agent_hint.cache_control")
            retention = None
    return Found(session, parent, None, retention)


def read(
    headers: Mapping[str, str], payload: Mapping[str, Any], route: Found = NOTHING
) -> DialectReading:
    """Every dialect's reading, highest precedence first (``route``: the route's own keys)."""
    if not has_dialect_headers(headers) and not any(k in payload for k in DIALECT_BODY_KEYS):
        # No dialect speaks (the common case): only the route's own keys.
        return DialectReading(sources=[("route", route)] if route != NOTHING else [])
    reading = DialectReading()
    reading.sources.append(("dynamo", _dynamo(headers, payload, reading)))
    reading.sources.append(("vllm", _vllm(payload, reading)))
    reading.sources.append(("route", route))
    if "prompt_cache_key" in payload:
        key = session_key(payload["prompt_cache_key"])
        if key is None:
            if payload["prompt_cache_key"] is not None:
                reading.skip("openai", "prompt_cache_key")
        else:
            reading.sources.append(("openai", Found(session=key)))
    raw = headers.get(LLMD_TOKEN)
    if raw is not None:
        token = session_key(raw)
        if token is None:
            reading.skip("llm-d", LLMD_TOKEN)
        else:
            reading.sources.append(("llm-d", Found(session=token)))
    return reading


def apply(hints: Hints, reading: DialectReading) -> tuple[Hints, list[tuple[str, str, str]]]:
    """``hints`` (Tenure's own, highest) completed from the dialects by precedence.

    Returns the merged hints and every counter event: ``used`` for a field taken from a
    dialect, ``overridden`` for one a higher source had already set to another value, plus the
    reading's own ``ignored``/``unknown`` events.
    """
    events = list(reading.events)
    merged: dict[str, Any] = {}
    current = {
        "session": hints.session,
        "parent": hints.parent,
        "last_turn": True if hints.last_turn else None,
        "retention_s": hints.retention_s,
    }
    for dialect, found in reading.sources:
        for name in _FIELDS:
            value = getattr(found, name)
            if value is None:
                continue
            label = _label(dialect, name)
            if current[name] is None:
                current[name] = merged[name] = value
                events.append((dialect, label, "used"))
            elif current[name] != value:
                events.append((dialect, label, "overridden"))
    if not merged:
        return hints, events
    if "last_turn" in merged:
        merged["last_turn"] = bool(merged["last_turn"])
    return replace(hints, **merged), events


_LABELS = {
    ("dynamo", "session"): "x-dynamo-session-id",
    ("dynamo", "parent"): "x-dynamo-parent-session-id",
    ("dynamo", "last_turn"): "x-dynamo-session-final",
    ("dynamo", "retention_s"): "nvext.cache_control",
    ("vllm", "session"): "agent_hint.session_id",
    ("vllm", "parent"): "agent_hint.parent_session_id",
    ("vllm", "retention_s"): "agent_hint.cache_control",
    ("openai", "session"): "prompt_cache_key",
    ("llm-d", "session"): "x-session-token",
    ("route", "session"): "session",
    ("route", "retention_s"): "retention_s",
}


def _label(dialect: str, name: str) -> str:
    return _LABELS.get((dialect, name), "unknown")
