"""The harness profiles (tenure.service.harness.profiles) on the fields the real CLIs send.

The headers and system blocks below are what Claude Code 2.1.332 and Codex 0.171.0 sent
through the scripted engine (tests/harness/test_real_clis.py runs the CLIs themselves).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tenure.service.harness.profiles import (
    CLAUDE_CODE,
    CODEX,
    GENERIC,
    HARNESS_FIELDS,
    parse_version,
    read,
)

AGENT = "x-claude-code-agent-id"
SESSION = "x-claude-code-session-id"
LEAD = "41043bd8-afb0-4e35-9cad-c49355812d70"
THREAD = "01a23552-2e62-7e41-8027-72617d345789"


def _claude_body(entry: str = "sdk-cli", subagent: bool = False) -> dict[str, Any]:
    billing = f"x-anthropic-billing-header: cc_version=2.1.332.114; cc_entrypoint={entry};"
    if subagent:
        billing += " cc_is_subagent=true;"
    return {
        "system": [{"type": "text", "text": billing}, {"type": "text", "text": "You are..."}],
        "metadata": {"user_id": json.dumps({"device_id": "d", "session_id": LEAD})},
    }


def _claude_headers(**extra: str) -> dict[str, str]:
    return {
        "user-agent": "claude-cli/2.1.332 (external, sdk-cli)",
        "x-claude-code-session-id": LEAD,
        **extra,
    }


def _codex_headers(
    originator: str = "codex_exec", thread: str = THREAD, **meta: Any
) -> dict[str, str]:
    metadata = {"session_id": THREAD, "thread_id": thread, "agent_name": "/root",
                "thread_source": "user", **meta}  # fmt: skip
    return {
        "user-agent": f"{originator}/0.171.0 (Debian 12.0.0; x86_64) unknown ({originator})",
        "originator": originator,
        "session-id": THREAD,
        "thread-id": thread,
        "x-codex-turn-metadata": json.dumps(metadata),
    }


def test_claude_code_lead_one_shot() -> None:
    reading = read(_claude_headers(), _claude_body())
    assert (reading.harness, reading.version) == (CLAUDE_CODE, "2.1.332")
    assert (reading.session, reading.parent, reading.subagent) == (LEAD, None, False)
    assert (reading.entrypoint, reading.one_shot) == ("sdk-cli", True)


def test_claude_code_interactive_keeps_the_human_gap() -> None:
    headers = _claude_headers(**{"user-agent": "claude-cli/2.1.332 (external, cli)"})
    reading = read(headers, _claude_body("cli"))
    assert (reading.entrypoint, reading.one_shot) == ("cli", False)


def test_claude_code_subagent_is_a_child_of_its_lead() -> None:
    headers = _claude_headers(**{"x-claude-code-agent-id": "a42085feec837a739"})
    reading = read(headers, _claude_body(subagent=True))
    assert reading.session == f"{LEAD}:agent-a42085feec837a739"
    assert (reading.parent, reading.subagent) == (LEAD, True)


def test_codex_exec_lead_and_subagent_thread() -> None:
    lead = read(_codex_headers(), {})
    assert (lead.harness, lead.session, lead.parent, lead.one_shot) == (CODEX, THREAD, None, True)
    child_thread = "01a23552-9999-7e41-8027-72617d345789"
    child = read(_codex_headers(thread=child_thread, thread_source="subagent"), {})
    assert (child.session, child.parent, child.subagent) == (child_thread, THREAD, True)
    tui = read(_codex_headers("codex_cli_rs"), {})
    assert (tui.entrypoint, tui.one_shot) == ("codex_cli_rs", False)


@pytest.mark.parametrize(
    ("headers", "body", "field"),
    [
        (_claude_headers(**{AGENT: "../../etc"}), _claude_body(), AGENT),
        (_claude_headers(**{SESSION: "not a valid id"}), _claude_body(), SESSION),
        (_claude_headers(), _claude_body(subagent=True), "cc_is_subagent"),
        ({**_codex_headers(), "x-codex-turn-metadata": "{not json"}, {}, "x-codex-turn-metadata"),
        ({**_codex_headers(), "thread-id": "bad id!"}, {}, "thread-id"),
    ],
)  # fmt: skip
def test_malformed_fields_change_nothing_and_are_counted(
    headers: dict[str, str], body: dict[str, Any], field: str
) -> None:
    reading = read(headers, body)
    assert not reading.subagent and reading.parent is None
    assert (reading.harness, field, "malformed") in reading.events


@pytest.mark.parametrize(
    ("headers", "harness"),
    [
        ({**_claude_headers(), "user-agent": "claude-cli/1.0.3 (external, sdk-cli)"}, CLAUDE_CODE),
        ({**_claude_headers(), "user-agent": "claude-cli/3.0.0 (external, sdk-cli)"}, CLAUDE_CODE),
        ({**_codex_headers(), "user-agent": "codex_exec/0.120.0 (Linux)"}, CODEX),
    ],
)
def test_unknown_versions_fall_back_to_the_generic_rules(
    headers: dict[str, str], harness: str
) -> None:
    headers = {**headers, "x-claude-code-agent-id": "a42085feec837a739"}
    reading = read(headers, _claude_body(subagent=True))
    assert (reading.session, reading.parent, reading.one_shot) == (None, None, False)
    assert reading.events == [(harness, "version", "unchecked")]


def test_sdks_and_unknown_clients_are_generic() -> None:
    assert read({"user-agent": "OpenAI/Python 2.3.0"}, {}).harness == "openai-sdk"
    assert read({"user-agent": "Anthropic/Python 0.70.0"}, {}).harness == "anthropic-sdk"
    plain = read({"user-agent": "python-httpx/0.28"}, {})
    assert (plain.harness, plain.session, plain.events) == (GENERIC, None, [])


def test_every_counted_label_is_from_the_fixed_set() -> None:
    hostile = {
        "user-agent": "claude-cli/2.1.332 (external, " + "x" * 500 + ")",
        "x-claude-code-session-id": "\u00e9" * 300,
        "x-claude-code-agent-id": "y" * 5000,
    }
    for headers in (hostile, {**_codex_headers(), "x-codex-turn-metadata": "[" * 100_000}):
        for harness, name, outcome in read(headers, {"system": [{"text": "z" * 10_000}]}).events:
            assert (harness, name) in HARNESS_FIELDS
            assert outcome in ("used", "malformed", "unchecked")


def test_parse_version() -> None:
    assert parse_version("2.1.332") == (2, 1, 332)
    assert parse_version("2.1.332-beta") is None and parse_version("") is None


def test_the_sidecar_rules_tenure_hints_win_and_the_end_is_switchable() -> None:
    from prometheus_client import CollectorRegistry

    from tenure.service.api.hints.harness import HarnessRules, likely_end
    from tenure.service.api.hints.tenure import Hints
    from tenure.service.metrics import Metrics

    rules = HarnessRules(Metrics(CollectorRegistry()))
    headers = _claude_headers(**{AGENT: "a42085feec837a739"})
    body = _claude_body(subagent=True)
    hints, reading = rules.apply(Hints(session=LEAD), Hints(), headers, body)
    assert (hints.session, hints.parent) == (f"{LEAD}:agent-a42085feec837a739", LEAD)
    own = Hints(session="mine")
    assert rules.apply(own, own, headers, body)[0] == own  # Tenure's own session wins
    assert likely_end(reading, "end_turn", 1.0, enabled=True) is not None
    assert likely_end(reading, "end_turn", 1.0, enabled=False) is None  # per tenant
    assert likely_end(reading, "tool_use", 1.0, enabled=True) is None
    interactive = read(_claude_headers(), _claude_body("cli"))
    assert likely_end(interactive, "end_turn", 1.0, enabled=True) is None
    one_shot = likely_end(read(_claude_headers(), _claude_body()), "end_turn", 1.0, enabled=True)
    assert one_shot is not None and one_shot.likely_end and not one_shot.reclaim
    assert one_shot.reason == "likely_end_one_shot"
