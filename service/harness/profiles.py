"""Harness profiles: what each agent harness's own traffic says about its session, its
sub-agents, its entry point and the end of a run, in one place.

A harness built for a hosted API does not send Tenure's hints, but it says a good deal in its
own words. Each profile below names the fields, where they sit, and the CLI version they were
checked on (by running the real CLI through ``tenure serve`` into a scripted engine,
``tests/harness/``). A version outside a profile's trusted range falls back to the generic
rules (the route's own session keys, dialects, prefix inference): the profile's fields are
read, counted as ``unchecked``, and change nothing. A field that is present but malformed
changes nothing either and is counted as ``malformed``; both land in
``tenure_harness_fields_total{harness, field, outcome}``, whose labels come from the fixed
:data:`HARNESS_FIELDS` set (client text never becomes a label).

**Claude Code** (``@anthropic-ai/claude-code``, checked on 2.1.332; the Claude Agent SDKs run
the same executable and send the same fields with another entry point):

* identity: ``User-Agent: claude-cli/<version> (external, <entrypoint>)`` and ``x-app: cli``;
* session: ``x-claude-code-session-id`` (also the ``session_id`` of the JSON in
  ``metadata.user_id``, which the route already reads);
* sub-agent: ``x-claude-code-agent-id: <id>`` on every request of a sub-agent started by the
  ``Agent`` (formerly ``Task``) tool, which otherwise sends the lead's session id and
  ``metadata.user_id``; its first system block also says ``cc_is_subagent=true``. The child is
  the session ``<lead>:agent-<id>`` with ``parent`` = the lead;
* entry point: ``cc_entrypoint=<name>`` in the first system block (the billing block,
  ``x-anthropic-billing-header: cc_version=...; cc_entrypoint=...;``), also in the
  User-Agent's parentheses. ``sdk-cli`` is ``claude -p`` (one-shot: the run ends with its final
  answer unless ``--continue``/``--resume`` comes back); ``cli`` is the interactive TUI;
  ``sdk-ts`` / ``sdk-py`` are the Agent SDKs (a program drives them: treated as interactive);
* the end: nothing on the wire; inferred for a one-shot entry point from the final answer
  (``stop_reason`` ``end_turn``).

**Codex** (``@openai/codex``, checked on 0.171.0), on ``/v1/responses``:

* identity: ``originator`` header (``codex_exec`` for ``codex exec``; ``codex_cli_rs`` /
  ``codex-tui`` interactive; other clients their own name) and
  ``User-Agent: <originator>/<version> ...``;
* session: ``thread-id`` (one conversation; also ``prompt_cache_key``); ``session-id`` is the
  root thread of the process, the same as ``thread-id`` for the lead;
* sub-agent: a thread spawned by the multi-agent tools sends its own ``thread-id`` with the
  root's ``session-id`` and ``"thread_source": "subagent"`` in ``x-codex-turn-metadata``
  (a JSON object: ``session_id``, ``thread_id``, ``agent_name``, ``turn_id``,
  ``request_kind``, ``turn_trigger``, ...). The child is the session ``thread-id`` with
  ``parent`` = ``session-id``;
* entry point: ``originator: codex_exec`` is one-shot (``codex exec``; ``codex exec resume
  --last`` continues the same thread id), anything else interactive;
* the end: inferred for ``codex_exec`` from the final answer (a completed response without a
  tool call).

**OpenAI SDKs** (``User-Agent: OpenAI/Python <v>``, ``OpenAI/JS <v>``, ``x-stainless-*``) and
**Anthropic SDKs** (``Anthropic/Python``, ``Anthropic/JS``): no session, sub-agent or entry
point of their own; the program names the session with the route's keys
(``prompt_cache_key``, ``conversation``, ``previous_response_id``, ``metadata.user_id``) or
Tenure's hints, and ends it with ``X-Tenure-Last-Turn``. Generic rules.

**LangGraph** (through ``langchain-openai`` / ``langchain-anthropic``, which use the SDKs
above): its ``thread_id`` lives in the graph's config and is not sent; a graph names its
session with the SDK's keys or Tenure's hints (the ``clients/`` SDK). Generic rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CLAUDE_CODE",
    "CODEX",
    "GENERIC",
    "HARNESS_FIELDS",
    "HARNESS_HEADERS",
    "HarnessReading",
    "Profile",
    "parse_version",
    "read",
]

CLAUDE_CODE = "claude-code"
CODEX = "codex"
OPENAI_SDK = "openai-sdk"
ANTHROPIC_SDK = "anthropic-sdk"
GENERIC = "generic"


@dataclass(frozen=True, slots=True)
class Profile:
    """One harness: the version its fields were checked on and the range trusted."""

    name: str
    checked_on: str
    #: Versions whose fields are read: ``[low, high)``; others fall back to the generic rules.
    trusted_from: tuple[int, ...]
    trusted_below: tuple[int, ...]
    #: Entry points whose final answer is a likely end of the run.
    one_shot: frozenset[str]
    #: The tool names by which the lead starts a sub-agent (its turn ends calling one).
    spawn_tools: frozenset[str]

    def trusts(self, version: tuple[int, ...] | None) -> bool:
        return version is not None and self.trusted_from <= version < self.trusted_below


PROFILES: dict[str, Profile] = {
    CLAUDE_CODE: Profile(
        CLAUDE_CODE,
        "2.1.332",
        (2, 1, 0),
        (3,),
        frozenset({"sdk-cli"}),
        frozenset({"Agent", "Task"}),
    ),
    CODEX: Profile(
        CODEX,
        "0.171.0",
        (0, 171, 0),
        (1,),
        frozenset({"codex_exec"}),
        frozenset({"spawn_agent", "multi_agent_v1"}),
    ),
}

#: Every (harness, field) label pair the counter may carry.
HARNESS_FIELDS: frozenset[tuple[str, str]] = frozenset(
    {
        (CLAUDE_CODE, "version"),
        (CLAUDE_CODE, "x-claude-code-session-id"),
        (CLAUDE_CODE, "x-claude-code-agent-id"),
        (CLAUDE_CODE, "cc_entrypoint"),
        (CLAUDE_CODE, "cc_is_subagent"),
        (CODEX, "version"),
        (CODEX, "originator"),
        (CODEX, "thread-id"),
        (CODEX, "session-id"),
        (CODEX, "x-codex-turn-metadata"),
    }
)
#: The request headers the profiles read (lower case).
HARNESS_HEADERS = frozenset(
    {
        "user-agent",
        "originator",
        "x-claude-code-session-id",
        "x-claude-code-agent-id",
        "thread-id",
        "session-id",
        "x-codex-turn-metadata",
    }
)
#: Outcomes of a harness field: read and used, present but malformed, or read from a
#: version outside the trusted range (ignored).
OUTCOMES = ("used", "malformed", "unchecked")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_AGENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
#: Longest session id a profile builds for a child (``<lead>:agent-<id>``): Tenure's limit.
_MAX_ID = 128
_CLAUDE_UA = re.compile(r"^claude-cli/([0-9][0-9.]{0,31})(?:\s+\(([^)]{0,128})\))?")
_CODEX_UA = re.compile(r"^([A-Za-z0-9_ .-]{1,64})/([0-9][0-9.]{0,31})\b")
_BILLING = "x-anthropic-billing-header:"
_ENTRYPOINT = re.compile(r"\bcc_entrypoint=([A-Za-z0-9_.-]{1,32});?")
_SUBAGENT = re.compile(r"\bcc_is_subagent=([A-Za-z]{1,8});?")
_NAME = re.compile(r"^[A-Za-z0-9_. -]{1,64}$")
#: Longest ``x-codex-turn-metadata`` parsed (it is ~700 bytes; anything far larger is not it).
_MAX_METADATA = 8192


def parse_version(text: str) -> tuple[int, ...] | None:
    """``"2.1.332"`` -> ``(2, 1, 332)``; None when it is not dotted numbers."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 4 or not all(p.isdigit() and len(p) <= 9 for p in parts):
        return None
    return tuple(int(p) for p in parts)


@dataclass(slots=True)
class HarnessReading:
    """What a harness's own fields say about one request (None: nothing)."""

    harness: str = GENERIC
    version: str | None = None
    #: The harness's own id for the conversation (for a child: the child's own session).
    session: str | None = None
    #: The lead's session, for a sub-agent's request.
    parent: str | None = None
    subagent: bool = False
    entrypoint: str | None = None
    #: The entry point is one-shot: the run's final answer is a likely end.
    one_shot: bool = False
    #: ``(harness, field, outcome)`` counter events, labels from :data:`HARNESS_FIELDS`.
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def profile(self) -> Profile | None:
        return PROFILES.get(self.harness)

    def count(self, name: str, outcome: str) -> None:
        label = name if (self.harness, name) in HARNESS_FIELDS else "unknown"
        self.events.append((self.harness, label, outcome))


def _session_id(value: str | None) -> str | None:
    if value is None or not _ID.match(value):
        return None
    return value


def _first_system_text(payload: Mapping[str, Any]) -> str | None:
    system = payload.get("system")
    if isinstance(system, list) and system:
        first = system[0]
        if isinstance(first, dict) and isinstance(first.get("text"), str):
            return str(first["text"])[:512]
    elif isinstance(system, str):
        return system[:512]
    return None


def _claude_code(
    headers: Mapping[str, str], payload: Mapping[str, Any], match: re.Match[str]
) -> HarnessReading:
    reading = HarnessReading(CLAUDE_CODE, match.group(1))
    profile = PROFILES[CLAUDE_CODE]
    if not profile.trusts(parse_version(match.group(1))):
        reading.count("version", "unchecked")
        return reading  # generic rules: the route's own keys name the session
    billing = _first_system_text(payload)
    entry: str | None = None
    subagent_flag = False
    if billing is not None and billing.startswith(_BILLING):
        found = _ENTRYPOINT.search(billing)
        if found is not None:
            entry = found.group(1)
        else:
            reading.count("cc_entrypoint", "malformed")
        flag = _SUBAGENT.search(billing)
        if flag is not None:
            if flag.group(1) in ("true", "false"):
                subagent_flag = flag.group(1) == "true"
            else:
                reading.count("cc_is_subagent", "malformed")
    if entry is None and match.group(2):
        # The User-Agent's parentheses: "external, sdk-cli".
        tail = match.group(2).split(",")[-1].strip()
        entry = tail if _NAME.match(tail) else None
    if entry is not None:
        reading.entrypoint = entry
        reading.one_shot = entry in profile.one_shot
        reading.count("cc_entrypoint", "used")
    raw = headers.get("x-claude-code-session-id")
    lead = _session_id(raw)
    if raw is not None:
        reading.count("x-claude-code-session-id", "used" if lead else "malformed")
    raw_agent = headers.get("x-claude-code-agent-id")
    if raw_agent is not None:
        if lead is not None and _AGENT_ID.match(raw_agent):
            child = f"{lead}:agent-{raw_agent}"
            if len(child) <= _MAX_ID:
                reading.session, reading.parent, reading.subagent = child, lead, True
                reading.count("x-claude-code-agent-id", "used")
                return reading
        reading.count("x-claude-code-agent-id", "malformed")
    elif subagent_flag:
        # A sub-agent that does not name itself cannot be told from its lead's other
        # sub-agents: it stays in the generic rules (counted, changes nothing).
        reading.count("cc_is_subagent", "malformed")
    reading.session = lead
    return reading


def _codex_metadata(reading: HarnessReading, raw: str | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    if len(raw) > _MAX_METADATA:
        reading.count("x-codex-turn-metadata", "malformed")
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        reading.count("x-codex-turn-metadata", "malformed")
        return None
    return value


def _codex(headers: Mapping[str, str], originator: str) -> HarnessReading:
    reading = HarnessReading(CODEX)
    profile = PROFILES[CODEX]
    agent = headers.get("user-agent", "")
    match = _CODEX_UA.match(agent)
    version = match.group(2) if match is not None else None
    reading.version = version
    if not profile.trusts(parse_version(version) if version else None):
        reading.count("version", "unchecked")
        return reading
    if not _NAME.match(originator):
        reading.count("originator", "malformed")
    else:
        reading.entrypoint = originator
        reading.one_shot = originator in profile.one_shot
        reading.count("originator", "used")
    metadata = _codex_metadata(reading, headers.get("x-codex-turn-metadata"))
    raw_thread = headers.get("thread-id")
    raw_root = headers.get("session-id")
    if metadata is not None:
        raw_thread = raw_thread or _str(metadata.get("thread_id"))
        raw_root = raw_root or _str(metadata.get("session_id"))
    thread, root = _session_id(raw_thread), _session_id(raw_root)
    if raw_thread is not None:
        reading.count("thread-id", "used" if thread else "malformed")
    if raw_root is not None:
        reading.count("session-id", "used" if root else "malformed")
    reading.session = thread or root
    source = metadata.get("thread_source") if metadata is not None else None
    spawned = source == "subagent" or (thread is not None and root is not None and thread != root)
    if spawned and thread is not None and root is not None and thread != root:
        reading.parent, reading.subagent = root, True
        reading.count("x-codex-turn-metadata", "used")
    elif spawned:
        reading.count("x-codex-turn-metadata", "malformed")
    return reading


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def read(headers: Mapping[str, str], payload: Mapping[str, Any]) -> HarnessReading:
    """The harness a request comes from and what its own fields say (lowercase headers)."""
    agent = headers.get("user-agent", "")
    if agent.startswith("claude-cli/"):
        match = _CLAUDE_UA.match(agent)
        if match is not None:
            return _claude_code(headers, payload, match)
        reading = HarnessReading(CLAUDE_CODE)
        reading.count("version", "malformed")
        return reading
    originator = headers.get("originator")
    if originator is not None and (originator.startswith("codex") or agent.startswith("codex")):
        return _codex(headers, originator)
    if agent.startswith(("OpenAI/", "AsyncOpenAI/")):
        return HarnessReading(OPENAI_SDK)
    if agent.startswith(("Anthropic/", "AsyncAnthropic/")):
        return HarnessReading(ANTHROPIC_SDK)
    return HarnessReading()
