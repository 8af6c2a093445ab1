"""The real Claude Code and Codex CLIs through a real ``tenure serve`` and Redis (issue 24).

Both CLIs are installed from the npm registry at pinned versions (``tests/harness/clis.py``;
skipped, with the reason, only where npm or the registry cannot be reached) and pointed at the
sidecar exactly as the docs tell a user to, in front of a scripted engine
(``tests/harness/scripted_engine.py``: one shell tool call, then a short answer). What is
checked is what the sidecar made of each run: sessions, parents, turns, decisions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis

from tenure.service.replay.loaders.canonical import load_canonical
from tenure.service.replay.model import Trace
from tests.conftest import RedisProcess, wait_for
from tests.harness import clis
from tests.harness.scripted_engine import Received, ScriptedEngine
from tests.sidecar.fake_upstream import ServerThread, free_port

CLAUDE_KEY = "sk-claude-test-key"
CODEX_KEY = "sk-codex-test-key"
ADMIN_TOKEN = "harness-admin-token"
PREFIX = "harness"
ANSWER = "Done: the shell printed tenure-ok."


@pytest.fixture(scope="module")
def installed() -> clis.Clis:
    found = clis.install()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@dataclass
class Stack:
    engine: ScriptedEngine
    url: str
    redis: redis.Redis
    tmp: Path

    def http(self, key: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=10
        )

    def session(self, key: str, session: str) -> dict[str, Any]:
        with self.http(key) as http:
            reply = http.get(f"/v1/sessions/{session}")
            assert reply.status_code == 200, reply.text
            view: dict[str, Any] = reply.json()
            return view

    def settled(self, key: str, session: str) -> dict[str, Any]:
        """The session once its turn in flight has ended (its record written)."""
        return wait_for(lambda: (v := self.session(key, session))["state"] != "active" and v)

    def decisions(self, scoped: str) -> list[dict[str, Any]]:
        """Every decision the sidecar published for one session, in order."""
        found = []
        entries = cast(
            "list[tuple[bytes, dict[bytes, bytes]]]", self.redis.xrange(f"{PREFIX}:decisions")
        )
        for _id, fields in entries:
            decision = json.loads(fields[b"d"])
            if decision["session_id"] == scoped:
                found.append(decision)
        return found


@pytest.fixture(scope="module")
def stack(
    installed: clis.Clis, redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    engine = ScriptedEngine()
    upstream = ServerThread(engine).start()
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(root),
        "TENURE_PORT": str(port),
        "TENURE_UPSTREAM_URL": upstream.url,
        "TENURE_REDIS_URL": redis_server.url,
        "TENURE_REDIS_PREFIX": PREFIX,
        "TENURE_ADMIN_TOKEN": ADMIN_TOKEN,
        "TENURE_PUSH_ADDR": "",
        "TENURE_SEGMENTS": "1",
        "TENURE_RECORD_ENABLED": "1",
        "TENURE_TENANTS": json.dumps(
            {CLAUDE_KEY: {"name": "claude"}, CODEX_KEY: {"name": "codex"}}
        ),
    }
    db = redis.Redis.from_url(redis_server.url)
    for key in db.scan_iter(f"{PREFIX}:*"):
        db.delete(key)
    # Its log goes to a file: a pipe nobody reads would block the server once full.
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    log_file = log_path.open("wb")
    serve = subprocess.Popen(
        [sys.executable, "-m", "tenure.service.cli", "serve"], env=env, cwd=root,
        stdout=log_file, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if serve.poll() is not None:
            raise RuntimeError(f"tenure serve exited: {log_path.read_text()[-2000:]}")
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout_s=240, interval_s=0.5)
        yield Stack(engine, url, db, tmp_path_factory.mktemp("harness"))
    finally:
        serve.terminate()
        try:
            serve.wait(timeout=20)
        except subprocess.TimeoutExpired:
            serve.kill()
        upstream.stop()
        log_file.close()


def _claude(stack: Stack, installed: clis.Clis, work: Path, *args: str) -> clis.CliRun:
    work.mkdir(parents=True, exist_ok=True)
    env = clis.claude_env(stack.url, CLAUDE_KEY, work / "home")
    argv = [str(installed.claude), "-p", *args, "--allowedTools", "Bash Agent Task"]
    return clis.run(argv, env, work)


def _codex(stack: Stack, installed: clis.Clis, work: Path, *args: str) -> clis.CliRun:
    work.mkdir(parents=True, exist_ok=True)
    home = clis.codex_home(work / "codex-home", f"{stack.url}/v1")
    env = clis.codex_env(home, CODEX_KEY, work / "home")
    flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
    return clis.run([str(installed.codex), "exec", *flags, *args], env, work)


def _since(stack: Stack, mark: int) -> list[Received]:
    return [r for r in stack.engine.received[mark:] if r.path.startswith("/v1/")]


def _answered(requests: list[Received]) -> list[Received]:
    return [r for r in requests if r.answer and r.answer not in ("500", "cut")]


def _tenure(request: Received) -> dict[str, Any]:
    tags: dict[str, Any] = request.body["kv_transfer_params"]["tenure"]
    return tags


def _recorded(stack: Stack) -> Trace:
    """The sidecar's recording so far, exported and loaded as the replay loads it."""
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        reply = http.get(
            "/admin/record/export?block_tokens=16",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
    assert reply.status_code == 200, reply.text
    path = stack.tmp / "recorded.jsonl"
    path.write_text(reply.text)
    return load_canonical(path)


def _check_ended_one_shot(view: dict[str, Any], turns: int) -> None:
    assert view["turn"] == turns  # turns equal answered requests
    assert view["reason"] == "likely_end_one_shot"
    assert view["eviction_class"] == "finished"  # evicted before any live session
    assert view["state"] == "idle"  # not reclaimed: a resumed run still hits it


def test_claude_code_plain_and_resumed_run(stack: Stack, installed: clis.Clis) -> None:
    work = stack.tmp / "claude-plain"
    mark = len(stack.engine.received)
    first = _claude(stack, installed, work, "Use the shell")
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == ANSWER  # relayed byte for byte
    sent = _since(stack, mark)
    sessions = {r.headers["x-claude-code-session-id"] for r in sent}
    assert len(sessions) == 1
    (session,) = sessions
    assert all(_tenure(r)["session_id"] == f"claude/{session}" for r in sent)
    view = stack.settled(CLAUDE_KEY, session)
    _check_ended_one_shot(view, len(_answered(sent)))
    assert view["parent"] is None
    # Ended within one turn of the final answer: the final answer's own decision says so.
    final = stack.decisions(f"claude/{session}")[-1]
    assert final["likely_end"] is True and final["turn"] == len(_answered(sent))
    assert final["state"] == "idle" and final["last_turn"] is False

    again = _claude(stack, installed, work, "--continue", "Use the shell again")
    assert again.returncode == 0, again.stderr
    resumed = _since(stack, mark)
    assert {r.headers["x-claude-code-session-id"] for r in resumed} == {session}
    view = stack.settled(CLAUDE_KEY, session)
    _check_ended_one_shot(view, len(_answered(resumed)))  # the same session, counted on


def test_claude_code_subagent_is_a_child_session(stack: Stack, installed: clis.Clis) -> None:
    work = stack.tmp / "claude-sub"
    mark = len(stack.engine.received)
    run = _claude(stack, installed, work, "Please [spawn] a sub-agent to check the shell")
    assert run.returncode == 0, run.stderr
    sent = _since(stack, mark)
    lead_requests = [r for r in sent if "x-claude-code-agent-id" not in r.headers]
    child_requests = [r for r in sent if "x-claude-code-agent-id" in r.headers]
    assert lead_requests and child_requests
    assert lead_requests[0].answer == "tool:Agent"
    (lead,) = {r.headers["x-claude-code-session-id"] for r in sent}
    (agent,) = {r.headers["x-claude-code-agent-id"] for r in child_requests}
    child = f"{lead}:agent-{agent}"
    lead_view = stack.settled(CLAUDE_KEY, lead)
    child_view = stack.settled(CLAUDE_KEY, child)
    assert child_view["parent"] == lead and lead_view["parent"] is None
    # The worker class and the spawn record, as the engine receives them.
    first = _tenure(child_requests[0])
    assert first["role"] == "worker" and first["parent_session"] == f"claude/{lead}"
    assert first["predicted_lifetime_s"] > 0  # the ranker's prediction at the spawn
    assert all(_tenure(r)["role"] == "lead" for r in lead_requests)
    assert child_view["turn"] == len(_answered(child_requests))
    assert lead_view["turn"] == len(_answered(lead_requests))
    assert child_view["reason"] == "likely_end_subagent"
    assert lead_view["reason"] == "likely_end_one_shot"
    # The child's requests were tagged as its own session, with the lead as parent.
    assert all(_tenure(r)["session_id"] == f"claude/{child}" for r in child_requests)
    assert all(_tenure(r)["parent"] == f"claude/{lead}" for r in child_requests)
    # While the foreground child ran, no decision of the lead predicted a human gap.
    began, ended = child_requests[0].at, child_requests[-1].at
    during = [
        d for d in stack.decisions(f"claude/{lead}")
        if began <= d["issued_at"] <= ended + 1.0 and d["turn"] == 1
    ]  # fmt: skip
    assert during, "the lead got no decision while its child ran"
    assert all(d["reason"] != "predicted_human" for d in during)
    assert {d["reason"] for d in during} & {"awaiting_child", "child_returned"}
    # The recording replays as a parent and a child, each ending where the sidecar said.
    trace = _recorded(stack)
    children = [s for s in trace.sessions if s.parent is not None]
    assert children, "no sub-agent in the recording"
    for child_session in children:
        lead_session = trace.sessions[child_session.parent]  # type: ignore[index]
        assert lead_session.parent is None
        assert child_session.turns[-1].likely_end and lead_session.turns[-1].likely_end
        assert len(child_session.turns) == len(_answered(child_requests))


def test_claude_code_failing_first_attempt_and_cut_stream(
    stack: Stack, installed: clis.Clis
) -> None:
    for fault in ("500", "cut"):
        work = stack.tmp / f"claude-{fault}"
        mark = len(stack.engine.received)
        stack.engine.faults.append(fault)
        run = _claude(stack, installed, work, "Use the shell")
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == ANSWER
        sent = _since(stack, mark)
        assert sent[0].answer == fault and len(sent) > len(_answered(sent))
        (session,) = {r.headers["x-claude-code-session-id"] for r in sent}
        view = stack.settled(CLAUDE_KEY, session)
        _check_ended_one_shot(view, len(_answered(sent)))  # the retry is the same turn
        # The retry was forwarded as the same turn the failed attempt had.
        assert _tenure(sent[0])["turn"] == _tenure(sent[1])["turn"] == 1


def test_codex_plain_resumed_failing_and_cut_runs(stack: Stack, installed: clis.Clis) -> None:
    work = stack.tmp / "codex"
    mark = len(stack.engine.received)
    first = _codex(stack, installed, work, "Use the shell")
    assert first.returncode == 0, first.stderr
    assert ANSWER in first.stdout
    sent = _since(stack, mark)
    (thread,) = {r.headers["thread-id"] for r in sent}
    assert {r.headers["originator"] for r in sent} == {"codex_exec"}
    view = stack.settled(CODEX_KEY, thread)
    _check_ended_one_shot(view, len(_answered(sent)))
    assert all(_tenure(r)["session_id"] == f"codex/{thread}" for r in sent)

    stack.engine.faults.extend(["cut"])
    again = _codex(stack, installed, work, "resume", "--last", "Use the shell again")
    assert again.returncode == 0, again.stderr
    resumed = _since(stack, mark)
    assert {r.headers["thread-id"] for r in resumed} == {thread}
    assert any(r.answer == "cut" for r in resumed)
    view = stack.settled(CODEX_KEY, thread)
    _check_ended_one_shot(view, len(_answered(resumed)))

    stack.engine.faults.extend(["500"])
    mark = len(stack.engine.received)
    failing = _codex(stack, installed, stack.tmp / "codex-500", "Use the shell")
    assert failing.returncode == 0, failing.stderr
    sent = _since(stack, mark)
    assert sent[0].answer == "500"
    (thread,) = {r.headers["thread-id"] for r in sent}
    _check_ended_one_shot(stack.settled(CODEX_KEY, thread), len(_answered(sent)))


def test_codex_subagent_is_a_child_session(stack: Stack, installed: clis.Clis) -> None:
    """Codex's multi-agent tools: the lead calls ``spawn_agent`` and ``wait_agent``; the child
    thread sends its own ``thread-id`` with the root's ``session-id``."""
    work = stack.tmp / "codex-sub"
    mark = len(stack.engine.received)
    run = _codex(stack, installed, work, "Please [spawn] a sub-agent to check the shell")
    assert run.returncode == 0, run.stderr
    assert ANSWER in run.stdout
    sent = _since(stack, mark)

    def source(request: Received) -> str:
        return str(json.loads(request.headers["x-codex-turn-metadata"])["thread_source"])

    lead_requests = [r for r in sent if source(r) != "subagent"]
    child_requests = [r for r in sent if source(r) == "subagent"]
    assert lead_requests and child_requests
    assert [r.answer for r in lead_requests[:2]] == ["tool:spawn_agent", "tool:wait_agent"]
    (lead,) = {r.headers["thread-id"] for r in lead_requests}
    (child,) = {r.headers["thread-id"] for r in child_requests}
    assert child != lead and {r.headers["session-id"] for r in sent} == {lead}
    lead_view = stack.settled(CODEX_KEY, lead)
    child_view = stack.settled(CODEX_KEY, child)
    assert child_view["parent"] == lead and lead_view["parent"] is None
    # The worker class and the spawn record, as the engine receives them.
    first = _tenure(child_requests[0])
    assert first["role"] == "worker" and first["parent_session"] == f"codex/{lead}"
    assert first["predicted_lifetime_s"] > 0
    assert all(_tenure(r)["session_id"] == f"codex/{child}" for r in child_requests)
    assert all(_tenure(r)["parent"] == f"codex/{lead}" for r in child_requests)
    assert all(_tenure(r)["role"] == "lead" for r in lead_requests)
    assert child_view["turn"] == len(_answered(child_requests))
    assert lead_view["turn"] == len(_answered(lead_requests))
    assert child_view["reason"] == "likely_end_subagent"
    assert lead_view["reason"] == "likely_end_one_shot"
    # While the child ran (the lead in wait_agent), no decision of the lead was a human gap.
    began, ended = child_requests[0].at, child_requests[-1].at
    during = [
        d for d in stack.decisions(f"codex/{lead}") if began <= d["issued_at"] <= ended + 1.0
    ]  # fmt: skip
    assert during, "the lead got no decision while its child ran"
    assert all(d["reason"] != "predicted_human" for d in during), during
    assert {d["reason"] for d in during} & {"awaiting_child", "child_returned"}, during


def test_malformed_harness_fields_change_nothing_and_are_counted(stack: Stack) -> None:
    """A request that claims to be Claude Code with broken fields is served as generic."""
    body = {
        "model": "scripted", "max_tokens": 16,
        "metadata": {"user_id": json.dumps({"session_id": "generic-session-1"})},
        "messages": [{"role": "user", "content": "hi"}],
    }  # fmt: skip
    headers = {
        "x-api-key": CLAUDE_KEY,
        "user-agent": "claude-cli/2.1.332 (external, sdk-cli)",
        "x-claude-code-session-id": "not a valid id!",
        "x-claude-code-agent-id": "../../etc",
    }
    reply = httpx.post(f"{stack.url}/v1/messages", json=body, headers=headers, timeout=10)
    assert reply.status_code == 200
    view = stack.settled(CLAUDE_KEY, "generic-session-1")
    assert view["parent"] is None and view["turn"] == 1
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    assert (
        'tenure_harness_fields_total{field="x-claude-code-agent-id",harness="claude-code",'
        'outcome="malformed"}' in metrics
    )
    old = {**headers, "user-agent": "claude-cli/1.0.3 (external, cli)"}
    reply = httpx.post(f"{stack.url}/v1/messages", json=body, headers=old, timeout=10)
    assert reply.status_code == 200
    time.sleep(0)  # the counter is written before the answer leaves
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    assert (
        'tenure_harness_fields_total{field="version",harness="claude-code",'
        'outcome="unchecked"}' in metrics
    )
