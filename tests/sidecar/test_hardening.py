"""Holes an adversarial probe of ``tenure serve`` found (issue 10), each closed and tested.

Everything runs against the real sidecar over HTTP, a real Redis and the fake engine of
``fake_upstream`` (a network boundary we do not own), and checks both the answer and that
nothing was forwarded or stored where nothing should be.
"""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import httpx
import pytest
import redis

from tenure.service.settings import SettingsError, TenantSpec, load_settings
from tenure.service.state.scripts import INFERENCE_KEYS_PER_SESSION
from tests.conftest import wait_for

CHAT = "/v1/chat/completions"
ADMIN = {"Authorization": "Bearer test-admin-token"}


def _chat(model: str = "echo", messages=None, **extra):
    return {"model": model, "messages": messages or [{"role": "user", "content": "hi"}], **extra}


def _forged(session: str = "beta/victim") -> dict[str, Any]:
    return {"session_id": session, "turn": 9, "last_turn": True}


def _engine_tenure(body: Any) -> list[Any]:
    """Every ``kv_transfer_params.tenure`` the engine received, at any depth."""
    found = []

    def walk(node) -> None:
        if isinstance(node, dict):
            kv = node.get("kv_transfer_params")
            if isinstance(kv, dict) and "tenure" in kv:
                found.append(kv["tenure"])
            xargs = node.get("vllm_xargs")
            if isinstance(xargs, dict) and "kv_transfer_params" in xargs:
                found.append(xargs["kv_transfer_params"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(body)
    return found


def _series(metrics: str, name: str) -> list[str]:
    return [line for line in metrics.splitlines() if line.startswith(name + "{")]


# --- hole 1: the sidecar owns kv_transfer_params.tenure ------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"model": "echo", "prompt": "x"}),
        (CHAT, {"model": "echo", "messages": []}),
        # (/v1/responses is tracked since issue 15: test_responses_route checks it carries
        # only the sidecar's tenure.)
        ("/v1/messages/count_tokens", {"model": "echo", "messages": []}),
        ("/v1/embeddings", {"model": "echo", "input": ["x"]}),
    ],
)
def test_client_tenure_params_never_reach_the_engine_untracked(upstream, client, path, body):
    """Tenant A cannot name another tenant's session (nor say last_turn) to the engine."""
    fake, _ = upstream
    sent = {**body, "kv_transfer_params": {"tenure": _forged(), "do_remote_prefill": False}}
    reply = client.post(path, json=sent)
    assert reply.status_code == 200
    received = fake.received[-1].body
    assert _engine_tenure(received) == []
    # The client's other transfer parameters are its own and pass.
    assert received["kv_transfer_params"] == {"do_remote_prefill": False}


def test_client_tenure_params_stripped_when_inference_is_off(upstream, sidecar_factory):
    fake, _ = upstream
    server = sidecar_factory(tenants={"key-a": TenantSpec(name="alpha", infer_sessions=False)})
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer key-a"}) as http:
        reply = http.post(CHAT, json=_chat(kv_transfer_params={"tenure": _forged()}))
    assert reply.status_code == 200
    assert _engine_tenure(fake.received[-1].body) == []


def test_client_tenure_params_stripped_at_any_depth_and_in_vllm_xargs(upstream, client):
    fake, _ = upstream
    nested = {
        "model": "echo",
        "requests": [{"kv_transfer_params": {"tenure": _forged()}}],
        "vllm_xargs": {"kv_transfer_params": ["x"]},
    }
    assert client.post("/v1/batch", json=nested).status_code == 200
    assert _engine_tenure(fake.received[-1].body) == []
    body = _chat(vllm_xargs={"kv_transfer_params": ["x"], "seed": 3})
    assert client.post("/v1/completions", json=body).status_code == 200
    assert fake.received[-1].body["vllm_xargs"] == {"seed": 3}


def test_tracked_request_carries_only_the_sidecars_tenure(upstream, client):
    fake, _ = upstream
    body = _chat(kv_transfer_params={"tenure": _forged()})
    assert client.post(CHAT, json=body, headers={"X-Tenure-Session": "mine"}).status_code == 200
    [tenure] = _engine_tenure(fake.received[-1].body)
    assert tenure["session_id"] == "default/mine"
    assert tenure["last_turn"] is False


@pytest.mark.parametrize(
    ("path", "raw", "content_type"),
    [
        # Python's json (the engine's parser) reads NaN and UTF-16; the sidecar does not, so it
        # must not forward them unread.
        (CHAT, b'{"model": "echo", "messages": [], "temperature": NaN, '
               b'"kv_transfer_params": {"tenure": {"session_id": "beta/v"}}}', "application/json"),
        ("/v1/completions", json.dumps({"model": "echo", "prompt": "x", "kv_transfer_params": {
            "tenure": _forged()}}).encode("utf-16"), "application/json"),
        ("/v1/responses", json.dumps({"kv_transfer_params": {"tenure": _forged()}}).encode(
            "utf-16"), "application/json; charset=utf-16"),
        ("/v1/responses", b'{"kv_transfer_params": {"tenure": 1}, "x": Infinity}', None),
        (CHAT, b"[1, 2]", "application/json"),
    ],
)  # fmt: skip
def test_bodies_the_sidecar_cannot_read_are_refused_not_forwarded(
    upstream, client, path, raw, content_type
):
    fake, _ = upstream
    headers = {"content-type": content_type} if content_type else {}
    reply = client.post(path, content=raw, headers=headers)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "invalid_body"
    assert fake.received == []


# --- hole 2: a non-ASCII bearer token -------------------------------------------------------


def test_non_ascii_bearer_tokens_are_refused_not_500(client, sidecar_factory):
    for token in ("Bearer tökén".encode(), b"Bearer \xff\xfe", "Bearer 管理".encode()):
        for path in ("/admin/config", "/admin/decisions"):
            reply = client.get(path, headers=[(b"authorization", token)])
            assert reply.status_code == 401, (token, path)
            assert reply.json()["error"]["code"] == "invalid_admin_token"
    server = sidecar_factory(tenants={"key-a": TenantSpec(name="alpha")})
    with httpx.Client(base_url=server.url) as http:
        for path in ("/v1/sessions", "/v1/models"):
            raw = [(b"authorization", "Bearer ключ".encode())]
            assert http.get(path, headers=raw).status_code == 401
        reply = http.post(CHAT, json=_chat(), headers=[(b"authorization", b"Bearer \xe9")])
        assert reply.status_code == 401


# --- hole 3: every label set is bounded ---------------------------------------------------------


def test_unknown_hint_fields_do_not_become_metric_labels(client):
    for i in range(60):
        reply = client.post(CHAT, json=_chat(tenure={"session": "s", f"field_{i}": 1}))
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == f"tenure.field_{i}"  # the answer still names it
    metrics = client.get("/metrics").text
    assert "field_" not in metrics
    rejections = _series(metrics, "tenure_hint_rejections_total")
    assert rejections == ['tenure_hint_rejections_total{field="tenure.unknown"} 60.0']


def test_worker_roles_do_not_grow_the_decision_labels(client):
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "hub"})
    for i in range(100):
        spawn = {"worker_id": f"hub.w{i}", "role": f"role{i}"}
        assert client.post("/v1/sessions/hub/workers", json=spawn).status_code == 201
    spawned = [s for s in _series(client.get("/metrics").text, "tenure_decisions_total")
               if "spawned" in s or "other" in s]  # fmt: skip
    assert len(spawned) <= 65
    assert any('reason="other"' in s for s in spawned)


# --- hole 4: deep JSON and huge integers ----------------------------------------------------------


@pytest.mark.parametrize("depth", [900, 1100, 5000])
def test_deeply_nested_json_is_a_400_not_a_500(upstream, client, depth):
    fake, _ = upstream
    deep = "[" * depth + "]" * depth
    raw = f'{{"model": "echo", "messages": [], "extra": {deep}}}'.encode()
    for path in (CHAT, "/v1/completions"):
        reply = client.post(path, content=raw, headers={"X-Tenure-Session": "d"})
        assert reply.status_code in (200, 400), reply.text
    for path in ("/v1/responses",):
        assert client.post(path, content=raw).status_code in (200, 400)
    body = f'{{"reason": "x", "expected_wait_s": {deep}}}'
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "deep"})
    reply = client.post("/v1/sessions/deep/suspend", content=body.encode())
    assert reply.status_code in (400, 422)
    assert "error" in reply.json()
    # What was forwarded, the engine could read; nothing deeper than the sidecar checks.
    for received in fake.received:
        assert isinstance(received.body, dict)


def test_a_400_digit_integer_gap_is_a_400_not_a_500(upstream, client):
    fake, _ = upstream
    for field in ("expected_gap_ms", "expected_gap_s"):
        hints = f'{{"session": "s", "{field}": {"9" * 400}}}'
        raw = f'{{"model": "echo", "messages": [], "tenure": {hints}}}'
        reply = client.post(CHAT, content=raw.encode())
        assert reply.status_code == 400
        assert reply.json()["error"]["param"] == f"tenure.{field}"
    reply = client.post(
        CHAT, json=_chat(), headers={"X-Tenure-Session": "s", "X-Tenure-Expected-Gap-Ms": "9" * 400}
    )
    assert reply.status_code == 400
    assert fake.received == []
    raw_wait = '{"expected_wait_s": ' + "9" * 400 + "}"
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "w"})
    assert client.post("/v1/sessions/w/suspend", content=raw_wait.encode()).status_code == 422


# --- hole 5: worker metadata that cannot be read back


def test_deep_worker_metadata_is_refused_and_nothing_stored(client, redis_url):
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "lead"})
    for depth in (9, 300, 450):
        metadata: dict[str, Any] = {}
        node = metadata
        for _ in range(depth - 1):
            node["a"] = {}
            node = node["a"]
        assert len(json.dumps(metadata)) < 4096
        spawn = {"worker_id": f"lead.w{depth}", "metadata": metadata}
        reply = client.post("/v1/sessions/lead/workers", json=spawn)
        assert reply.status_code == 422, depth
        assert reply.json()["detail"][0]["loc"][-1] == "metadata"
        assert client.get(f"/v1/sessions/lead.w{depth}").status_code == 404
    assert client.get("/v1/sessions/lead").json()["workers"] == []
    shallow = {"worker_id": "lead.ok", "metadata": {"a": {"b": {"c": [1, {"d": 2}]}}}}
    assert client.post("/v1/sessions/lead/workers", json=shallow).status_code == 201
    assert client.get("/v1/sessions/lead.ok").json()["metadata"] == shallow["metadata"]


def test_a_stored_record_with_deep_metadata_still_reads(client, redis_url):
    """A record written before the limit (or by another writer) never turns reads into 500s."""
    client.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "old"})
    wait_for(lambda: client.get("/v1/sessions/old").json()["state"] == "idle")
    deep = '{"a":' * 300 + "1" + "}" * 300
    redis.Redis.from_url(redis_url).hset("tenure:s:default:old", "metadata", deep)
    reply = client.get("/v1/sessions/old")
    assert reply.status_code == 200
    assert reply.json()["metadata"] == {}
    listed = client.get("/v1/sessions")
    assert listed.status_code == 200
    assert [s["session_id"] for s in listed.json()["sessions"]] == ["old"]


# --- hole 6: an upstream that dies mid-stream


def test_upstream_dying_mid_stream_ends_with_an_error_event(upstream, client):
    body = b""
    with client.stream(
        "POST", CHAT, json=_chat("die", stream=True), headers={"X-Tenure-Session": "cut"}
    ) as reply:
        assert reply.status_code == 200  # sent before the engine died
        body = b"".join(reply.iter_raw())
    events = [e for e in body.split(b"\n\n") if e]
    assert events[0] == b'data: {"n": 0}'
    error = json.loads(events[-2].removeprefix(b"data: "))
    assert error["error"]["code"] == "upstream_unreachable"
    assert events[-1] == b"data: [DONE]"

    # Counted as the engine's failure, not the client's (after the answer: wait for it).
    def counted() -> str:
        text: str = client.get("/metrics").text
        return text if 'tenure_upstream_errors_total{kind="unreachable"} 1.0' in text else ""

    metrics = wait_for(counted)
    assert "tenure_client_disconnects_total 0.0" in metrics


def test_the_official_client_raises_on_a_cut_stream(sidecar):
    import openai

    api = openai.OpenAI(base_url=f"{sidecar.url}/v1", api_key="none", max_retries=0)
    stream = api.chat.completions.create(
        model="die", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError):
        for _chunk in stream:
            pass


# --- hole 7: passthrough stays under /v1


def _raw_get(port: int, target: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET " + target + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/%2e%2e/metrics",
        b"/v1/%2E%2E/admin/config",
        b"/v1/../metrics",
        b"/v1/models/../../metrics",
        b"/v1/./models",
        b"/v1/..%2fmetrics",
        b"/v1/%2e%2e%5cmetrics",
        b"/v1/%252e%252e/metrics",
        b"/v1/models%00",
        b"/v1/load_lora_adapter",
    ],
)
def test_passthrough_never_leaves_v1(upstream, sidecar, target):
    fake, _ = upstream
    answer = _raw_get(sidecar.port, target)
    assert answer.startswith(b"HTTP/1.1 404"), answer[:200]
    assert b'"code":"not_found"' in answer
    assert fake.received == []


def test_ordinary_passthrough_paths_still_forwarded(upstream, client):
    fake, _ = upstream
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models/some-model.v2:latest").status_code == 200
    assert [r.path for r in fake.received] == ["/v1/models", "/v1/models/some-model.v2:latest"]


# --- hole 8: wrong methods on the sidecar's own routes


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("PUT", "/v1/sessions/x/end", 405, "POST"),
        ("DELETE", "/v1/sessions/x", 405, "GET"),
        ("PATCH", "/v1/sessions/x/suspend", 405, "POST"),
        ("POST", "/v1/sessions", 405, "GET"),
        ("GET", "/v1/sessions/x/workers", 405, "POST"),
        ("GET", "/v1/sessions/x/unknown", 404, None),
        ("POST", "/v1/sessions/x/y/z", 404, None),
        ("GET", CHAT, 405, "POST"),
        ("DELETE", "/v1/completions", 405, "POST"),
    ],
)
def test_wrong_methods_are_answered_here_not_forwarded(
    upstream, client, method, path, status, allow
):
    fake, _ = upstream
    reply = client.request(method, path)
    assert reply.status_code == status, reply.text
    assert reply.headers.get("allow") == allow
    assert "error" in reply.json()
    assert fake.received == []


# --- hole 10: session-inference keys are bounded per session


def test_inference_keeps_a_bounded_number_of_prefix_keys(upstream, client, redis_url):
    fake, _ = upstream
    db = redis.Redis.from_url(redis_url)
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    history = []
    for turn in range(1, 31):
        assert client.post(CHAT, json=_chat(messages=messages)).status_code == 200
        history.append(list(messages))
        messages = [*messages, {"role": "assistant", "content": f"a{turn}"},
                    {"role": "user", "content": f"u{turn}"}]  # fmt: skip
    tenure = fake.received[-1].body["kv_transfer_params"]["tenure"]
    assert tenure["turn"] == 30
    assert len(db.keys("tenure:px:*")) <= INFERENCE_KEYS_PER_SESSION
    # A retried turn, and a fork from two turns back, still find the session.
    for replay in (history[-1], history[-2]):
        client.post(CHAT, json=_chat(messages=replay))
        assert (
            fake.received[-1].body["kv_transfer_params"]["tenure"]["session_id"]
            == (tenure["session_id"])
        )
    assert len(db.keys("tenure:px:*")) <= INFERENCE_KEYS_PER_SESSION


# --- hole 11: the schema and one error shape


def test_schema_lists_the_proxy_routes_and_every_answer(client):
    schema = client.get("/openapi.json").json()
    paths = schema["paths"]
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/{path}"):
        assert path in paths
    chat = paths["/v1/chat/completions"]["post"]
    assert {"400", "401", "413", "502", "504", "default"} <= set(chat["responses"])
    assert {p["name"] for p in chat["parameters"]} >= {"X-Tenure-Session", "X-Tenure-Last-Turn"}
    for path, item in paths.items():
        if not path.startswith("/v1/sessions"):
            continue
        for operation in item.values():
            assert {"400", "401", "404", "409", "413", "422", "503"} <= set(operation["responses"])
            ref = operation["responses"]["404"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorResponse")
    for operation in paths["/admin/config"].values():
        assert {"401", "422", "503"} <= set(operation["responses"])


def test_config_patch_schema_advertises_no_null_it_rejects(client):
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    nullable = []
    for name in ("ConfigPatch", "PricePatch"):
        for field, spec in schema[name]["properties"].items():
            if "null" in json.dumps(spec) or spec.get("default", 0) is None:
                nullable.append(field)
    assert nullable == ["lambda_fixed_per_s"]
    for patch in ({"host_slots": None}, {"price": None}, {"price": {"beta2_gpu_s": None}},
                  {"policy_mode": None}):  # fmt: skip
        reply = client.patch("/admin/config", json=patch, headers=ADMIN)
        assert reply.status_code == 422, patch
        assert "null" in reply.json()["error"]["message"]
    assert client.get("/admin/config", headers=ADMIN).json()["version"] == 0
    assert client.patch("/admin/config", json={"lambda_fixed_per_s": None},
                        headers=ADMIN).status_code == 200  # fmt: skip


def test_lifecycle_and_admin_errors_share_one_shape(client, sidecar_factory):
    server = sidecar_factory(tenants={"key-a": TenantSpec(name="alpha")}, api_max_body_bytes=2048)
    key = {"Authorization": "Bearer key-a"}
    with httpx.Client(base_url=server.url) as http:
        http.post(CHAT, json=_chat(), headers={**key, "X-Tenure-Session": "s"})
        http.post("/v1/sessions/s/end", headers=key)
        bad_json = {**key, "content-type": "application/json"}
        deep = b"[" * 1000 + b"]" * 1000  # valid JSON too deep for a parser here
        answers = [
            (401, http.get("/v1/sessions")),
            (401, http.get("/admin/config")),
            (404, http.get("/v1/sessions/none", headers=key)),
            (409, http.post("/v1/sessions/s/suspend", headers=key)),
            (413, http.post("/admin/waits", headers=ADMIN, content=b"[" + b"1," * 3000 + b"1]")),
            (422, http.get("/v1/sessions/bad id!", headers=key)),
            (405, http.put("/v1/sessions/s/end", headers=key)),
            (422, http.post("/v1/sessions/s/suspend", headers=bad_json, content=b"{nope")),
            (400, http.post("/v1/sessions/s/suspend", headers=bad_json, content=deep)),
        ]
    for status, reply in answers:
        assert reply.status_code == status, (status, reply.text)
        body = reply.json()
        assert set(body) == {"error", "detail"}, body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"]
    assert isinstance(answers[5][1].json()["detail"], list)


# --- hole 12: hints, settings and secrets


@pytest.mark.parametrize(
    ("hints", "param"),
    [
        ({"session": "a", "session_id": "b"}, "tenure.session_id"),
        ({"session": "a", "expected_gap_ms": 1000, "expected_gap_s": 5}, "tenure.expected_gap_s"),
    ],
)
def test_conflicting_hint_spellings_are_refused(upstream, client, hints, param):
    fake, _ = upstream
    reply = client.post(CHAT, json=_chat(tenure=hints))
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == param
    assert fake.received == []
    agreeing = {"session": "a", "session_id": "a", "expected_gap_ms": 5000, "expected_gap_s": 5}
    assert client.post(CHAT, json=_chat(tenure=agreeing)).status_code == 200


@pytest.mark.parametrize(
    "token", ["x", " ", "            ", "short-token", "has space in it!", "tök-en-token-1"]
)
def test_weak_admin_tokens_are_refused(token):
    with pytest.raises(SettingsError, match="TENURE_ADMIN_TOKEN"):
        load_settings(admin_token=token)


def test_malformed_tenants_env_is_one_line_without_the_value(monkeypatch):
    import subprocess
    import sys

    env = {"TENURE_ADMIN_TOKEN": "a-long-enough-token", "TENURE_TENANTS": '{"sk-secret-1": {',
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "tenure.service.cli", "serve"], env=env, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "tenure: error: TENURE_TENANTS is not valid JSON"
    assert "Traceback" not in done.stderr and "sk-secret-1" not in done.stderr


def test_dev_mode_on_a_public_address_warns():
    settings = load_settings(dev_mode=True, host="0.0.0.0", push_addr="")
    assert any("admin API is open" in w for w in settings.startup_warnings())
    assert load_settings(dev_mode=True, push_addr="").startup_warnings() == []


def test_tenant_keys_are_never_forwarded_upstream(upstream, sidecar_factory):
    fake, _ = upstream
    tenants = {"sk-tenant-secret": TenantSpec(name="alpha")}
    plain = sidecar_factory(tenants=tenants)
    keyed = sidecar_factory(tenants=tenants, upstream_api_key="engine-key")
    for server, expected in ((plain, None), (keyed, "Bearer engine-key")):
        with httpx.Client(base_url=server.url) as http:
            auth = {"Authorization": "Bearer sk-tenant-secret"}
            assert http.post(CHAT, json=_chat(), headers=auth).status_code == 200
            assert fake.received[-1].headers.get("authorization") == expected
            assert http.get("/v1/models", headers=auth).status_code == 200
            assert fake.received[-1].headers.get("authorization") == expected


def test_settings_dump_holds_no_raw_keys():
    settings = load_settings(
        admin_token="admin-token-1234", tenants={"sk-raw-key-1": {"name": "acme"}},
        upstream_api_key="up-key-9", push_addr="",
    )  # fmt: skip
    for dump in (settings.model_dump(), settings.model_dump(mode="json")):
        text = repr(dump) + json.dumps(dump, default=str)
        for secret in ("sk-raw-key-1", "admin-token-1234", "up-key-9"):
            assert secret not in text
    [digest] = settings.tenants
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    # A dump configures the same sidecar again (digests are accepted as keys).
    again = load_settings(admin_token="admin-token-1234", tenants=settings.model_dump()["tenants"],
                          push_addr="")  # fmt: skip
    assert again.tenants == settings.tenants


def test_a_tenant_configured_by_digest_resolves(upstream, sidecar_factory):
    import hashlib

    digest = "sha256:" + hashlib.sha256(b"sk-given-as-digest").hexdigest()
    server = sidecar_factory(tenants={digest: TenantSpec(name="acme")})
    with httpx.Client(base_url=server.url) as http:
        reply = http.post(CHAT, json=_chat(), headers={"Authorization": "Bearer sk-given-as-digest",
                                                      "X-Tenure-Session": "d"})  # fmt: skip
    assert reply.status_code == 200
    assert upstream[0].received[-1].body["kv_transfer_params"]["tenure"]["session_id"] == "acme/d"
