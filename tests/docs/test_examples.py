"""Every code example of the documentation runs, against a real ``tenure serve`` on a real Redis.

The examples are the files under ``docs/examples/`` that the pages include (never copies); the
README's SDK example must be the same text as ``docs/examples/sdk_quickstart.py``. Each one runs
as a user would run it (``python FILE`` / ``bash FILE``), pointed by environment variables at a
``tenure serve`` process; the engine behind it is the recording fake of
``tests/sidecar/fake_upstream`` (a boundary we do not own). A run passes when it exits 0 and the
engine received what the example says it sends.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tenure.service.processes import free_port
from tests.conftest import RedisProcess, wait_for
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
ADMIN_TOKEN = "docs-admin-token-0123"
API_KEY = "sk-docs-tenant-0123"


@dataclass
class Served:
    url: str
    engine: FakeUpstream

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "TENURE_URL": self.url,
            "TENURE_API_KEY": API_KEY,
            "TENURE_ADMIN_TOKEN": ADMIN_TOKEN,
            "MODEL": "echo",
        }

    def tenure_tags(self, path: str, session: str) -> list[dict[str, Any]]:
        """``kv_transfer_params.tenure`` of every request of ``session`` (its id without the
        tenant scope) the engine got on ``path``."""
        tags = [
            r.body["kv_transfer_params"]["tenure"]
            for r in self.engine.received
            if r.path == path and isinstance(r.body, dict) and "kv_transfer_params" in r.body
        ]
        return [t for t in tags if str(t.get("session_id", "")).endswith(f"/{session}")]


@pytest.fixture(scope="module")
def served(
    redis_server: RedisProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One ``tenure serve`` for the module (each example uses its own session ids)."""
    if not redis_server.running:
        redis_server.start()
    redis_server.flush()
    redis_url = redis_server.url
    tmp_path = tmp_path_factory.mktemp("serve")
    engine = FakeUpstream()
    upstream = ServerThread(engine).start()
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "TENURE_PORT": str(port),
        "TENURE_UPSTREAM_URL": upstream.url,
        "TENURE_REDIS_URL": redis_url,
        "TENURE_ADMIN_TOKEN": ADMIN_TOKEN,
        "TENURE_PUSH_ADDR": "",
    }
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tenure.service.cli", "serve", "--log-level", "warning"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout_s=90, interval_s=0.2)
        yield Served(url, engine)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        upstream.stop()


def _run(served: Served, *argv: str) -> str:
    done = subprocess.run(
        argv, env=served.env(), cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _session(served: Served, session: str) -> dict[str, Any]:
    answer = httpx.get(
        f"{served.url}/v1/sessions/{session}",
        headers={"Authorization": f"Bearer {API_KEY}"},
        timeout=10,
    )
    answer.raise_for_status()
    record: dict[str, Any] = answer.json()
    return record


def test_every_example_file_is_tested() -> None:
    """A new example needs a test here: the list below is the directory's content."""
    tested = {
        "sdk_quickstart.py", "openai_headers.py", "anthropic_messages.py",
        "responses_chain.py", "langgraph_approval.py", "raw_http.sh", "sre_retention.sh",
        "claude_code.sh", "codex_config.toml",
    }  # fmt: skip
    assert {p.name for p in EXAMPLES.iterdir() if p.is_file()} == tested


def test_readme_sdk_example_is_the_tested_file() -> None:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert (EXAMPLES / "sdk_quickstart.py").read_text() in blocks


def test_sdk_quickstart(served: Served) -> None:
    _run(served, sys.executable, str(EXAMPLES / "sdk_quickstart.py"))
    tags = served.tenure_tags("/v1/chat/completions", "task-42")
    assert [t.get("last_turn", False) for t in tags] == [False, True]
    assert tags[0]["expected_gap_s"] == pytest.approx(2.0)
    assert _session(served, "task-42")["state"] == "finished"


def test_openai_headers(served: Served) -> None:
    _run(served, sys.executable, str(EXAMPLES / "openai_headers.py"))
    tags = served.tenure_tags("/v1/chat/completions", "oai-1")
    assert len(tags) >= 2
    assert tags[0]["expected_gap_s"] == pytest.approx(1.5)
    assert _session(served, "oai-1")["state"] == "finished"


def test_anthropic_messages(served: Served) -> None:
    out = _run(served, sys.executable, str(EXAMPLES / "anthropic_messages.py"))
    assert "message_stop" in out
    tags = served.tenure_tags("/v1/messages", "cc-7")
    assert len(tags) == 2
    assert tags[0]["retention_s"] == pytest.approx(3600.0)
    assert _session(served, "cc-7")["state"] == "finished"


def test_responses_chain(served: Served) -> None:
    _run(served, sys.executable, str(EXAMPLES / "responses_chain.py"))
    tags = [
        r.body["kv_transfer_params"]["tenure"]
        for r in served.engine.received
        if r.path == "/v1/responses" and isinstance(r.body, dict)
    ]
    assert len(tags) == 2 and tags[0]["session_id"] == tags[1]["session_id"]
    assert tags[1]["turn"] == 2


def test_langgraph_approval(served: Served) -> None:
    pytest.importorskip("langgraph")
    out = _run(served, sys.executable, str(EXAMPLES / "langgraph_approval.py"))
    assert "waiting for approval: suspended" in out
    assert "after approval: finished" in out


def test_raw_http(served: Served) -> None:
    out = _run(served, "bash", str(EXAMPLES / "raw_http.sh"))
    tags = served.tenure_tags("/v1/chat/completions", "sh-1")
    assert len(tags) == 2
    assert [t["expected_gap_s"] for t in tags] == [pytest.approx(5.0)] * 2
    assert '"state":"finished"' in out.replace(" ", "")


def test_sre_retention(served: Served) -> None:
    # A turn first, so the default tenant has a controller to show.
    _run(served, sys.executable, str(EXAMPLES / "openai_headers.py"))
    out = _run(served, "bash", str(EXAMPLES / "sre_retention.sh"))
    assert '"lambda_mode":"fixed"' in out.replace(" ", "")
    assert '"lambda_mode":"auto"' in out.replace(" ", "")
    assert '"host_slots":425' in out.replace(" ", "")


def test_claude_code_check(served: Served) -> None:
    _run(served, "bash", str(EXAMPLES / "claude_code.sh"), "--check")
    tags = served.tenure_tags("/v1/messages", "0b7e6d36-4a57-4bbf-9d57-9a1c2f1de9a1")
    assert len(tags) == 1


def test_codex_config() -> None:
    """Codex reads this file itself; what must hold is that it points Codex at the sidecar's
    /v1 with the Responses wire API (the route that chains Codex's turns)."""
    config = tomllib.loads((EXAMPLES / "codex_config.toml").read_text())
    provider = config["model_providers"][config["model_provider"]]
    assert provider["base_url"].endswith("/v1")
    assert provider["wire_api"] == "responses"
