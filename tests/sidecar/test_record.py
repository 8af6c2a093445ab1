"""Recording through the real sidecar (fake upstream, real Redis): off by default, switched by
the setting or the admin REST, bounded, exported in the canonical format the replay loads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tenure.service.replay.loaders.canonical import load_canonical
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
    # Waits on the condition; the deadline only bounds a failure. 10 s was too short for a
    # loaded 2-core machine (a clean-clone CI run exported 0 sessions after it ran out).
    deadline = time.monotonic() + 120
    while True:
        status = _status(client)
        if status["turns"] >= n:
            return status
        assert time.monotonic() < deadline, f"{n} turns not recorded in 120 s: {status}"
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
    from tenure.service.cli import main

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


def _usage_of(r: httpx.Response) -> dict[str, int]:
    """The usage the client saw in an answer, whole or streamed (last value of each count)."""
    found: dict[str, int] = {}
    if r.headers["content-type"].startswith("text/event-stream"):
        objs = [json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:")]
    else:
        objs = [r.json()]
    for obj in objs:
        for usage in (
            obj.get("usage"),
            (obj.get("message") or {}).get("usage"),
            (obj.get("response") or {}).get("usage"),
        ):
            if isinstance(usage, dict):
                found.update({k: v for k, v in usage.items() if isinstance(v, int)})
    return found


def test_messages_and_responses_turns_are_recorded_and_replay(
    client: httpx.Client, tmp_path: Path, monkeypatch: Any
) -> None:
    """Both shaped routes recorded in the canonical format with their own usage fields and
    stop reasons, their prefix structure hashed from their own message structure, and the
    export replayed by ``tenure replay ladder --format canonical``."""
    from tenure.service.cli import main

    assert client.put("/admin/record", json={"enabled": True}, headers=ADMIN).status_code == 200
    secret = " ".join(f"secret{i}" for i in range(240))
    system = [{"type": "text", "text": "sys " * 60, "cache_control": {"type": "ephemeral"}}]
    first = [{"role": "user", "content": [{"type": "text", "text": secret}]}]
    cc_user = "user_ab12_account_00000000-0000-0000-0000-000000000001_session_" + "5" * 32
    seen: dict[str, list[tuple[int, int, str]]] = {"messages": [], "responses": []}

    def messages(model: str, msgs: list[Any], *, stream: bool) -> None:
        body = {
            "model": model, "max_tokens": 8, "system": system, "messages": msgs,
            "stream": stream, "metadata": {"user_id": cc_user},
        }  # fmt: skip
        r = client.post("/v1/messages", json=body)
        assert r.status_code == 200, r.text
        u = _usage_of(r)
        prompt = u["input_tokens"] + u.get("cache_read_input_tokens", 0)
        stop = "tool_use" if model == "tool" else "end_turn"
        seen["messages"].append((prompt, u["output_tokens"], stop))

    # (The fake engine picks its stop reason by model name: one model per session, as a
    # harness sends; a different model is a different prompt.)
    messages("tool", first, stream=True)
    # The next call: the breakpoint moved to the newest block, the answer and a tool result
    # appended (the prefix is the same bytes without the markers).
    marked = [{"type": "text", "text": "result " * 30, "cache_control": {"type": "ephemeral"}}]
    second = [
        {"role": "user", "content": [{"type": "text", "text": secret}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hi"}]},
        {"role": "user", "content": marked},
    ]
    messages("tool", second, stream=False)

    previous: str | None = None
    for k, (stream, text) in enumerate([(False, secret), (True, "more " * 40), (False, "x y")]):
        body: dict[str, Any] = {
            "model": "echo", "instructions": "be brief " * 20,
            "input": text, "stream": stream,
        }  # fmt: skip
        if previous is not None:
            body["previous_response_id"] = previous
        headers = {"X-Tenure-Last-Turn": "true"} if k == 2 else {}
        r = client.post("/v1/responses", json=body, headers=headers)
        assert r.status_code == 200, r.text
        if stream:
            done = [json.loads(x[5:]) for x in r.text.splitlines() if x.startswith("data:")]
            previous = done[-1]["response"]["id"]
        else:
            previous = r.json()["id"]
        u = _usage_of(r)
        stop = "stop"
        seen["responses"].append((u["input_tokens"], u["output_tokens"], stop))

    status = _wait_turns(client, 5)
    assert status["turns"] == 5 and status["dropped"] == 0
    out = tmp_path / "rec.jsonl"
    monkeypatch.setenv("TENURE_ADMIN_TOKEN", ADMIN_TOKEN)
    base = str(client.base_url).rstrip("/")
    assert main(["record", "--url", base, "export", "--out", str(out), "--block-tokens", "16"]) == 0
    text = out.read_text()
    # No text and no client session id leaves the sidecar.
    assert "secret" not in text and "sys" not in text and "5555" not in text
    trace = load_canonical(out)
    got = sorted(
        [(t.input_tokens, t.output_tokens, t.stop) for t in s.turns] for s in trace.sessions
    )
    assert got == sorted(seen.values())
    by_turns = {len(s.turns): s for s in trace.sessions}
    msgs, resp = by_turns[2], by_turns[3]
    # Messages: the second call shares the first's prefix (system + the first message).
    assert msgs.turns[1].seen_blocks >= (60 + 240) // 16 - 2
    # Responses: each chained call carries only its new input, yet shares the whole
    # conversation before it, as the engine's prompt does.
    assert resp.turns[1].seen_blocks >= resp.turns[0].blocks - 1
    assert resp.turns[2].seen_blocks >= resp.turns[1].blocks - 1
    assert resp.turns[2].input_tokens > resp.turns[1].input_tokens > resp.turns[0].input_tokens
    replayed = tmp_path / "replay.json"
    code = main([
        "replay", "ladder", "--format", "canonical", "--trace", str(out),
        "--policies", "lru,tenure", "--hardware", "cpu-tiny-fp32", "--host-gib", "0.01",
        "--arrival-rate", "1", "--seeds", "0", "--boot", "0", "--jobs", "1",
        "--json", str(replayed),
    ])  # fmt: skip
    assert code == 0
    results = json.loads(replayed.read_text())["results"]
    assert {name: r["turns"] for name, r in results.items()} == {"lru": 5, "tenure": 5}
    assert results["lru"]["prefill_tokens"] > 0


def test_responses_continuations_stay_per_tenant_and_bounded(monkeypatch: Any) -> None:
    """A chained Responses request continues only its own tenant's answer, and what a
    replica keeps for continuations is bounded (oldest answers go first)."""
    from tenure.service.api.hints.tenure import Hints
    from tenure.service.api.turns import recorder as rec

    class _Client:
        def register_script(self, script: str) -> None:
            return None

    r = rec.Recorder(
        _Client(), "t", enabled=True, max_bytes=1 << 20, chunk_bytes=256,  # type: ignore[arg-type]
        clock=time.time,
    )  # fmt: skip
    first = {"model": "m", "instructions": "i", "input": "w " * 400}
    pending = r.begin(first, Hints(), "responses", "alpha")
    assert pending is not None
    r.answered(pending, "alpha", "resp_1", {"input": 400, "output": 3})
    chained = {"model": "m", "instructions": "i", "input": "more", "previous_response_id": "resp_1"}
    mine = r.begin(chained, Hints(), "responses", "alpha")
    theirs = r.begin(chained, Hints(), "responses", "beta")
    assert mine is not None and theirs is not None
    assert mine.chunks[: len(pending.chunks)] == pending.chunks  # goes on from its answer
    assert theirs.chunks[0] != pending.chunks[0]  # another tenant's answer is not continued
    # Other instructions: a different prompt, not a continuation.
    other = r.begin({**chained, "instructions": "j"}, Hints(), "responses", "alpha")
    assert other is not None and other.chunks[0] != pending.chunks[0]
    monkeypatch.setattr(rec, "MAX_CONTINUATION_PIECES", 3 * len(pending.chunks))
    for i in range(10):
        r.answered(pending, "alpha", f"resp_x{i}", {"output": 3})
    assert len(r._continuations) == 3
    assert r._continuation_pieces == 3 * len(pending.chunks)
    assert ("alpha", "resp:resp_1") not in r._continuations  # the oldest went first


def test_tenure_record_cli_waits_out_a_503_with_retry_after(capsys: Any) -> None:
    """The sidecar answers 503 + Retry-After while its Redis is away for a moment; the CLI waits
    the delay and asks again instead of failing (the API's contract, as ``http_json`` keeps it)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tenure.service.cli import main

    answers = [503, 503, 200]
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            seen.append(self.path)
            code = answers.pop(0)
            body = json.dumps(
                {"enabled": True, "turns": 0, "bytes": 0, "max_bytes": 1, "dropped": 0,
                 "chunk_bytes": 1}
                if code == 200
                else {"error": {"message": "the recording's store (Redis) is unavailable"}}
            ).encode()  # fmt: skip
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if code == 503:
                self.send_header("Retry-After", "0.05")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert main(["record", "--url", url, "on"]) == 0
        assert '"enabled": true' in capsys.readouterr().out
        assert seen == ["/admin/record"] * 3 and answers == []
    finally:
        server.shutdown()
        server.server_close()
