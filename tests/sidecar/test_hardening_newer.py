"""Holes the second adversarial probe of ``tenure serve`` found (issue 23), in what was added
after the first: the worker-ranker artefact, the push channel's reports, the Redis topology
settings (and, with the one request pipeline, the newer routes).

As in ``test_hardening.py``: the real sidecar over HTTP (or as its own process, for start-up
errors), a real Redis, a real ZeroMQ peer; each test checks both the answer and that nothing
was stored, logged or forwarded that should not be.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from tenure.service.api.connections import redis_topology
from tenure.service.policy.ranker import RankerArtefactError, RidgeRanker
from tenure.service.policy.ranker_fit import fit_ridge
from tenure.service.settings import SettingsError, load_settings
from tenure.service.wire.push import Hello, ResidencyReport, ResyncRequest, Snapshot
from tests.conftest import wait_for
from tests.policy.test_ranker import synthetic
from tests.sidecar.fake_upstream import free_port
from tests.sidecar.test_push import Peer

ADMIN = {"Authorization": "Bearer test-admin-token"}


def _settings(**overrides: object):
    return load_settings(admin_token="a-long-enough-token", push_addr="", **overrides)


def _serve(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``tenure serve`` as an operator starts it, with only ``env`` (and a usable PATH)."""
    full = {
        "PATH": "/usr/bin:/bin",
        "TENURE_ADMIN_TOKEN": "a-long-enough-token",
        "TENURE_PUSH_ADDR": "",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "tenure.service.cli", "serve", "--port", str(free_port())],
        env=full, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


# --- 5: a bad ranker artefact crashes start-up ----------------------------------------------


def _deep_json(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def _huge_intercept() -> bytes:
    """A trained artefact, valid in every way but a 400-digit integer intercept."""
    doc = fit_ridge(synthetic(), 1.0).to_json()
    return json.dumps({**doc, "intercept": 10**400}).encode()


BAD_ARTEFACTS = {
    "not-utf8": lambda: b'{"format": "tenure-worker-ranker", "x": "\xff\xfe"}',
    "nested-100k": lambda: _deep_json(100_000),
    "huge-integer": _huge_intercept,
}


@pytest.mark.parametrize("kind", sorted(BAD_ARTEFACTS))
def test_a_bad_ranker_artefact_is_one_line_naming_the_file_and_exit_2(tmp_path: Path, kind):
    """Issue 23, defect 5: non-UTF-8 bytes, JSON nested 100k deep and a 400-digit integer
    each gave a traceback and exit 1."""
    path = tmp_path / f"ranker-{kind}.json"
    path.write_bytes(BAD_ARTEFACTS[kind]())
    done = _serve({"TENURE_WORKER_RANKER": str(path), "TENURE_SEGMENTS": "true"})
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"tenure: error: TENURE_WORKER_RANKER: {path}:")
    assert "Traceback" not in done.stderr


def test_a_huge_integer_in_every_number_field_is_refused(tmp_path: Path):
    """The in-process loader, field by field (a 400-digit integer is valid JSON)."""
    doc = fit_ridge(synthetic(), 1.0).to_json()
    huge = 10**400
    for key, bad in (
        ("intercept", huge),
        ("alpha", huge),
        ("weights", [huge] * len(doc["weights"])),
    ):
        with pytest.raises(RankerArtefactError, match=key) as info:
            RidgeRanker.from_json({**doc, key: bad}, "x.json")
        assert "\n" not in str(info.value)


# --- 6: a push peer floods the log with out-of-range reports --------------------------------


def _engine_moves(http: httpx.Client, engine: str) -> int | None:
    for row in http.get("/admin/engines", headers=ADMIN).json()["engines"]:
        if row["engine"] == engine:
            return int(row["sessions_moved_in"])
    return None


def _bad_frames(http: httpx.Client) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("tenure_push_bad_frames_total "):
            return float(line.split()[1])
    return 0.0


def test_out_of_range_residency_reports_are_counted_bad_and_dropped(
    sidecar_factory, caplog: pytest.LogCaptureFixture
):
    """Issue 23, defect 6: ``cold_sessions = 2**63`` overflowed Redis ``HINCRBY`` and logged a
    traceback per report. Such a report is a bad frame: counted, dropped, nothing logged, and
    the peer's next good report is taken as usual."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(push_addr=addr, push_snapshot_interval_s=60)
    peer = Peer(addr)
    try:
        peer.send(Hello(adapter_id="a1"))
        peer.receive(Snapshot)
        at = time.time()
        bad = [
            ResidencyReport(adapter_id="a1", report_seq=1, at=at, cold_sessions=2**63),
            ResidencyReport(adapter_id="a1", report_seq=2, at=at, bytes_stored=2**64 - 1),
            ResidencyReport(adapter_id="a1", report_seq=3, at=at, resident_bytes={"cpu": 2**63}),
            ResidencyReport(adapter_id="a1", report_seq=4, at=at, evicted_blocks={"lru": -(2**63)}),
        ]
        with caplog.at_level(logging.WARNING):
            for report in bad:
                peer.send(report)
            peer.send(ResidencyReport(adapter_id="a1", report_seq=5, at=at, cold_sessions=3))
            # A resync round trip: every report sent before it has been handled.
            peer.send(ResyncRequest(adapter_id="a1", last_seq=0))
            peer.receive(Snapshot)
            with httpx.Client(base_url=server.url, timeout=10) as http:
                wait_for(lambda: _engine_moves(http, "a1") == 3)
                assert _bad_frames(http) == len(bad)
                metrics = http.get("/metrics").text
        assert not [r for r in caplog.records if r.name.startswith("tenure.service.push")]
        assert 'tenure_adapter_resident_bytes{adapter="a1",tier="cpu"}' not in metrics
    finally:
        peer.close()


# --- 7: Redis settings: a password in the Sentinel list, a malformed URL --------------------


def test_a_sentinel_url_with_a_password_is_refused_without_echoing_it():
    """Issue 23, defect 7: ``redis://:<password>@host:port`` in TENURE_REDIS_SENTINELS was
    taken as the host ``redis://:<password>@host`` (the sidecar stayed degraded) and the
    topology's repr, built to hide credentials, showed the password."""
    secret = "s3cret-sentinel-pw"
    for value in (f"redis://:{secret}@127.0.0.1:26379", f"u:{secret}@10.0.0.1:26379"):
        with pytest.raises(SettingsError) as info:
            _settings(redis_sentinels=f"127.0.0.1:26380,{value}")
        assert secret not in str(info.value)
        assert "TENURE_REDIS_SENTINELS" in str(info.value)
    ok = _settings(redis_sentinels="127.0.0.1:26379,[::1]:26380,sentinel-a.svc:26379")
    assert redis_topology(ok).sentinels == (
        ("127.0.0.1", 26379), ("::1", 26380), ("sentinel-a.svc", 26379),
    )  # fmt: skip
    topology = redis_topology(
        ok.model_copy(update={"redis_url": SecretStr(f"redis://:{secret}@db:6379/0")})
    )
    assert secret not in repr(topology)


MALFORMED_URLS = {
    "bad-port": "redis://:pw-0123456789@127.0.0.1:notaport/0",
    "wrong-scheme": "http://:pw-0123456789@127.0.0.1:6379/0",
    "unclosed-ipv6": "redis://:pw-0123456789@[::1:6379/0",
    "port-99999": "redis://:pw-0123456789@127.0.0.1:99999/0",
    "no-host": "redis://:pw-0123456789@:6379/0",
    "bad-db": "redis://:pw-0123456789@127.0.0.1:6379/zero",
}


@pytest.mark.parametrize("kind", sorted(MALFORMED_URLS))
def test_a_malformed_redis_url_is_one_line_exit_2_without_the_secret(kind):
    """Issue 23, defect 7: a malformed TENURE_REDIS_URL gave a ~50-line traceback and exit 3.
    Expected: one line naming the setting, exit 2, no secret."""
    done = _serve({"TENURE_REDIS_URL": MALFORMED_URLS[kind]})
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "TENURE_REDIS_URL" in lines[0], done.stderr[-2000:]
    assert "pw-0123456789" not in done.stderr and "Traceback" not in done.stderr


def test_good_redis_urls_still_load():
    for url in ("redis://127.0.0.1:6379/0", "redis://:pw@[::1]:6380", "rediss://h.example/3",
                "unix:///run/redis.sock", "redis://localhost"):  # fmt: skip
        assert _settings(redis_url=url).redis_url.get_secret_value() == url


# --- the suite under load: one slow reply must not fail an operator's write ------------------

#: A Lua busy loop: Redis answers nobody for ``ARGV[1]`` ms (what a starved host looks like to
#: the sidecar: replies later than its socket timeout, then everything is fine again).
_STALL = """
local t = redis.call('TIME')
local until_us = t[1] * 1000000 + t[2] + ARGV[1] * 1000
repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us
return 1
"""


def test_an_admin_write_is_not_refused_because_a_proxied_turn_timed_out(
    sidecar_factory, redis_url: str
):
    """Issue 23, the suite under load: ``POST /admin/waits`` answered 503 on a busy machine.
    One Redis reply later than the socket timeout (there a starved host; here a 1 s stall)
    opened the breaker for every caller, and an operator's write in the next second was
    refused though Redis answered again. Proxied requests still fail open at once; the admin
    write goes to Redis, and its success closes the breaker for them."""
    import threading

    import redis as redis_lib

    server = sidecar_factory(redis_retry_after_s=30.0, redis_timeout_s=0.3)
    stall = threading.Thread(
        target=lambda: redis_lib.Redis.from_url(redis_url).eval(_STALL, 0, 1000), daemon=True
    )
    with httpx.Client(base_url=server.url, timeout=10) as http:
        chat = {"model": "echo", "messages": [{"role": "user", "content": "x"}]}
        assert http.post("/v1/chat/completions", json=chat, headers={"X-Tenure-Session": "s1"})
        stall.start()
        time.sleep(0.1)  # the stall has begun (a turn sent now waits past the timeout)
        reply = http.post("/v1/chat/completions", json=chat, headers={"X-Tenure-Session": "s2"})
        assert reply.status_code == 200  # failed open
        stall.join(timeout=30)
        # The breaker is open for 30 s; Redis answers again.
        assert "tenure_redis_errors_total" in http.get("/metrics").text
        stored = http.post("/admin/waits", json={"waits_s": [5.0] * 50}, headers=ADMIN)
        assert stored.status_code == 200, stored.text
        # ... and proxied turns are counted again (the patient write closed the breaker).
        http.post("/v1/chat/completions", json=chat, headers={"X-Tenure-Session": "s3"})
        wait_for(lambda: http.get("/v1/sessions/s3").status_code == 200, timeout_s=10)


def test_the_launchers_client_honours_retry_after_on_503():
    """``http_json`` (``tenure up``, ``tenure calibrate --write-sidecar``, the engine tests'
    admin calls) retries a 503 after its ``Retry-After``, within its timeout; other errors
    and a 503 past the timeout are raised."""
    import http.server
    import threading
    import urllib.error

    from tenure.service.processes import http_json

    answers = [503, 503, 200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            code = answers.pop(0) if answers else 503
            payload = b'{"ok": true}' if code == 200 else b"{}"
            self.send_response(code)
            if code == 503:
                self.send_header("Retry-After", "0")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/admin/waits"
    try:
        assert http_json("POST", url, {"waits_s": [1.0]}) == {"ok": True}
        with pytest.raises(urllib.error.HTTPError):
            http_json("POST", url, {"waits_s": [1.0]}, timeout=0.5)  # 503 for ever
    finally:
        server.shutdown()


# --- the newer routes (phase 2 of the probe, over the one request pipeline) -----------------

KEY_A, KEY_B = "sk-tenant-alpha-0123", "sk-tenant-beta-01234"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}


def _two_tenants(sidecar_factory, **overrides: object):
    from tenure.service.settings import TenantSpec

    tenants = {KEY_A: TenantSpec(name="alpha"), KEY_B: TenantSpec(name="beta")}
    return sidecar_factory(tenants=tenants, **overrides)


def _stored_response(http: httpx.Client, headers: dict[str, str]) -> str:
    reply = http.post("/v1/responses", json={"model": "echo", "input": "x"}, headers=headers)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["id"])


def test_a_client_request_id_on_responses_never_reaches_the_engine(sidecar_factory, upstream):
    """Issue 23, defect 2: vLLM takes a body ``request_id`` as the response's id and the key of
    its shared response store, so a tenant naming another's response id overwrote it (and the
    sidecar then listed the id as the attacker's too). It is refused in OpenAI's shape."""
    fake, _ = upstream
    server = _two_tenants(sidecar_factory)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        victim = _stored_response(http, A)
        sent = len(fake.received)
        for value in (victim, "mine-123"):
            reply = http.post(
                "/v1/responses", json={"model": "echo", "input": "x", "request_id": value},
                headers=B,
            )  # fmt: skip
            assert reply.status_code == 400, reply.text
            assert reply.json()["error"]["param"] == "request_id"
        assert len(fake.received) == sent
        assert all("request_id" not in (r.body or {}) for r in fake.received if r.body)
        # The victim still owns its response; the attacker does not.
        assert http.get(f"/v1/responses/{victim}", headers=B).status_code == 404
        assert http.get(f"/v1/responses/{victim}", headers=A).status_code != 404


def test_stored_response_paths_in_any_other_form_get_404(sidecar_factory, upstream):
    """Issue 23, defect 3: the ownership check matched one exact path shape; trailing or
    doubled slashes and ids over 256 characters went to the engine unchecked (a front proxy
    merging slashes would serve another tenant's response). Every form but the canonical one
    is 404, for the owner too, and nothing is forwarded."""
    fake, _ = upstream
    server = _two_tenants(sidecar_factory)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        victim = _stored_response(http, A)
        forms = [
            f"/v1/responses/{victim}/", f"/v1//responses/{victim}", f"/v1/responses//{victim}",
            f"/v1/responses/{victim}/cancel/", f"/v1/responses/{victim}/input_items/",
            f"/v1/responses/{victim}/other", f"/v1/responses/{'r' * 300}",
            f"/v1/responses/{'r' * 300}/cancel", "/v1/responses/",
        ]  # fmt: skip
        sent = len(fake.received)
        for path in forms:
            for headers in (A, B):
                for method in ("GET", "POST", "DELETE"):
                    reply = http.request(method, path, headers=headers)
                    assert reply.status_code == 404, (method, path, reply.status_code)
                    assert reply.json()["error"]["code"] == "not_found"
        assert len(fake.received) == sent
        # The canonical forms still reach the engine for the owner.
        assert http.get(f"/v1/responses/{victim}", headers=A).status_code == 200
        assert len(fake.received) == sent + 1


def _segments_chat_like(http: httpx.Client, route: str, session: str, **headers: str):
    body: dict[str, object]
    if route == "/v1/messages":
        body = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
    else:
        body = {"model": "echo", "input": "x"}
    return http.post(route, json=body, headers={"X-Tenure-Session": session, **headers})


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/responses"])
def test_segment_checks_hold_on_messages_and_responses(sidecar_factory, upstream, route):
    """Issue 23, defect 4: with segments on, ``/v1/messages`` and ``/v1/responses`` accepted a
    returned worker's next turn (chat: 409 ``worker_returned``), an unknown parent (chat: 404)
    and a session naming itself as parent (chat: 400)."""
    fake, _ = upstream
    server = sidecar_factory(segments=True)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        assert _segments_chat_like(http, route, "lead").status_code == 200
        spawned = http.post("/v1/sessions/lead/workers", json={"worker_id": "w1"})
        assert spawned.status_code == 201, spawned.text
        assert _segments_chat_like(http, route, "w1").status_code == 200
        wait_for(lambda: http.get("/v1/sessions/w1").json().get("turn") == 1)
        assert http.post("/v1/sessions/w1/return").status_code == 200
        sent = len(fake.received)
        late = _segments_chat_like(http, route, "w1")
        assert late.status_code == 409, late.text
        assert http.get("/v1/sessions/w1").json()["state"] == "finished"
        orphan = _segments_chat_like(http, route, "w3", **{"X-Tenure-Parent": "nobody"})
        assert orphan.status_code == 404, orphan.text
        assert http.get("/v1/sessions/w3").status_code == 404
        itself = _segments_chat_like(http, route, "w4", **{"X-Tenure-Parent": "w4"})
        assert itself.status_code == 400, itself.text
        assert len(fake.received) == sent


def _is_anthropic_error(reply: httpx.Response) -> bool:
    body = reply.json()
    return (
        body.get("type") == "error"
        and isinstance(body.get("error"), dict)
        and isinstance(body["error"].get("type"), str)
        and isinstance(body["error"].get("message"), str)
    )


def test_errors_on_the_messages_family_are_in_anthropics_shape(sidecar_factory):
    """Issue 23, defect 8: the sidecar's own 405 on ``/v1/messages`` and its 401 / 400 on
    ``/v1/messages/count_tokens`` were in OpenAI's shape; the README promises Anthropic's."""
    server = _two_tenants(sidecar_factory)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            reply = http.request(method, "/v1/messages", headers=A)
            assert reply.status_code == 405 and _is_anthropic_error(reply), (method, reply.text)
        body = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
        unknown = http.post("/v1/messages/count_tokens", json=body)
        assert unknown.status_code == 401 and _is_anthropic_error(unknown), unknown.text
        bad = http.post(
            "/v1/messages/count_tokens", content=b"{not json", headers={**A,
            "Content-Type": "application/json"},
        )  # fmt: skip
        assert bad.status_code == 400 and _is_anthropic_error(bad), bad.text


def test_refused_first_turns_on_responses_leave_no_records(sidecar_factory, redis_url: str):
    """Issue 23, defect 9: a first turn with no session key that the engine refused left a
    session record (7-day TTL) and an index entry: a tenant grew Redis at request rate."""
    import redis as redis_lib

    server = _two_tenants(sidecar_factory)
    client = redis_lib.Redis.from_url(redis_url)
    counts = []
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for batch in (5, 20):
            for _ in range(batch):
                # A non-string model: the fake engine refuses it with a 400, as vLLM does.
                reply = http.post("/v1/responses", json={"model": 7, "input": "x"}, headers=B)
                assert reply.status_code == 400
            wait_for(lambda: http.get("/v1/sessions", headers=B).json()["sessions"] == [])
            counts.append(client.dbsize())
    assert counts[0] == counts[1], counts  # no growth with the request count
    assert not client.keys("*beta*r-*")


def test_one_tenants_waits_never_decide_anothers_branch(sidecar_factory):
    """Issue 23, defect 1: every tenant's observed resume waits went into one global list, and
    a tenant short of its own minimum was scored on it as if an SRE had posted it. Beta's
    suspensions must not move alpha's branch, nor be named as ``POST /admin/waits``."""
    server = _two_tenants(sidecar_factory, retention_min_samples=20)
    chat = {"model": "echo", "messages": [{"role": "user", "content": "x"}]}
    with httpx.Client(base_url=server.url, timeout=10) as http:
        config = {"host_slots": 1, "w_ref_s": 1000, "lambda_mode": "fixed",
                  "lambda_fixed_per_s": 1.0}  # fmt: skip
        assert http.patch("/admin/config", json=config, headers=ADMIN).status_code == 200
        decide = "/admin/retention/decide?tenant=alpha"
        first = http.post(decide, headers=ADMIN).json()
        alpha_before = next(t for t in first["tenants"] if t["tenant"] == "alpha")
        for i in range(30):
            session = f"b{i}"
            started = http.post(
                "/v1/chat/completions", json=chat, headers={**B, "X-Tenure-Session": session}
            )
            assert started.status_code == 200
            path = f"/v1/sessions/{session}"
            wait_for(lambda: http.get(path, headers=B).json()["state"] == "idle")  # noqa: B023
            assert http.post(f"/v1/sessions/{session}/suspend", json={"reason": "approval"},
                             headers=B).status_code == 200  # fmt: skip
        time.sleep(1.3)  # the waits beta's resumes observe
        for i in range(30):
            assert http.post(f"/v1/sessions/b{i}/resume", json={}, headers=B).status_code == 200
        after = http.post(decide, headers=ADMIN).json()
        alpha_after = next(t for t in after["tenants"] if t["tenant"] == "alpha")
        assert alpha_after["branch"] == alpha_before["branch"], alpha_after
        assert "/admin/waits" not in str(alpha_after.get("reason", ""))
