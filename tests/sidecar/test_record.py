"""Recording through the real sidecar (fake upstream, real Redis): off by default, switched by
the setting or the admin REST, bounded, exported in the canonical format the replay loads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from service.replay.loaders.canonical import load_canonical
from tests.sidecar.conftest import ADMIN_TOKEN

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _chat(client: httpx.Client, session: str, text: str, *, stream: bool, **headers: str) -> None:
    body = {"model": "echo", "messages": [{"role": "user", "content": text}], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = client.post(
        "/v1/chat/completions", json=body, headers={"X-Tenure-Session": session, **headers}
    )
    assert r.status_code == 200


def _status(client: httpx.Client) -> dict[str, Any]:
    r = client.get("/admin/record", headers=ADMIN)
    assert r.status_code == 200
    status: dict[str, Any] = r.json()
    return status


def _wait_turns(client: httpx.Client, n: int) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        status = _status(client)
        if status["turns"] >= n or time.monotonic() > deadline:
            return status
        time.sleep(0.05)


def test_off_by_default_then_switched_on_by_admin(client: httpx.Client, tmp_path: Path) -> None:
    _chat(client, "s1", "a b c", stream=False)
    assert _status(client)["enabled"] is False
    assert client.put("/admin/record", json={"enabled": True}).status_code == 401
    r = client.put("/admin/record", json={"enabled": True}, headers=ADMIN)
    assert r.status_code == 200 and r.json()["enabled"] is True
    words = " ".join(f"w{i}" for i in range(300))
    _chat(client, "s1", words, stream=True)
    _chat(client, "s1", words + " more words", stream=False, **{"X-Tenure-Last-Turn": "true"})
    _chat(client, "s2", "secret text here", stream=True, **{"X-Tenure-Parent": "s1"})
    status = _wait_turns(client, 3)
    assert status["turns"] == 3 and status["dropped"] == 0
    r = client.get("/admin/record/export?block_tokens=16", headers=ADMIN)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    assert "secret" not in r.text and "s1" not in r.text.split("\n", 1)[1]
    path = tmp_path / "rec.jsonl"
    path.write_text(r.text)
    trace = load_canonical(path)
    by_len = sorted(trace.sessions, key=lambda s: -len(s.turns))
    first, child = by_len
    assert [t.input_tokens for t in first.turns] == [300, 302]
    assert [t.output_tokens for t in first.turns] == [3, 3]
    assert first.turns[1].seen_blocks >= 300 // 16 - 2  # the append shares the prefix
    assert child.parent is not None and child.turns[0].input_tokens == 3
    # Switched off: nothing more is kept; clear forgets it.
    client.put("/admin/record", json={"enabled": False}, headers=ADMIN)
    _chat(client, "s3", "x", stream=False)
    time.sleep(0.2)
    assert _status(client)["turns"] == 3
    assert client.delete("/admin/record", headers=ADMIN).json()["turns"] == 0


def test_setting_switches_it_on_and_the_bound_holds(
    sidecar_factory: Callable[..., Any],
) -> None:
    server = sidecar_factory(record_enabled=True, record_max_bytes=2048)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        client.delete("/admin/record", headers=ADMIN)
        for i in range(40):
            _chat(client, f"b{i}", "w " * 200, stream=False)
        deadline = time.monotonic() + 10
        while _status(client)["turns"] + _status(client)["dropped"] < 40:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status = _status(client)
        assert status["enabled"] is True
        assert 0 < status["bytes"] <= 2048 and status["dropped"] > 0
        assert status["turns"] + status["dropped"] == 40


def test_tenure_record_cli_switches_and_exports(
    client: httpx.Client, tmp_path: Path, monkeypatch: Any, capsys: Any
) -> None:
    from service.cli import main

    base = str(client.base_url).rstrip("/")
    monkeypatch.delenv("TENURE_ADMIN_TOKEN", raising=False)
    assert main(["record", "--url", base, "on"]) == 2  # no token: the admin route says 401
    assert "HTTP 401" in capsys.readouterr().err
    monkeypatch.setenv("TENURE_ADMIN_TOKEN", ADMIN_TOKEN)
    assert main(["record", "--url", base, "on"]) == 0
    assert '"enabled": true' in capsys.readouterr().out
    _chat(client, "cli", "w " * 40, stream=False)
    _wait_turns(client, 1)
    out = tmp_path / "rec.jsonl"
    assert main(["record", "--url", base, "export", "--out", str(out), "--block-tokens", "8"]) == 0
    assert "1 sessions" in capsys.readouterr().out
    trace = load_canonical(out)
    assert trace.block_tokens == 8 and trace.sessions[0].turns[0].input_tokens == 40
    missing = tmp_path / "no" / "rec.jsonl"
    assert main(["record", "--url", base, "export", "--out", str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err
