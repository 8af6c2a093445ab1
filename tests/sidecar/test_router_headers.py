"""Router affinity headers: the sidecar keys a router (vllm-router's consistent_hash on
X-Session-ID, llm-d, Dynamo) on the session it tracked, never on what the client sent."""

from __future__ import annotations

import httpx

from tenure.service.wire.engine_session import engine_session_id

CHAT = "/v1/chat/completions"


def _body(text: str = "hi") -> dict[str, object]:
    return {"model": "echo", "messages": [{"role": "user", "content": text}]}


def test_tracked_turns_carry_the_scoped_session(upstream, sidecar_factory):
    fake, _ = upstream
    sidecar = sidecar_factory(upstream_session_headers="X-Session-ID, x-dynamo-session-id")
    with httpx.Client(base_url=sidecar.url, timeout=10) as http:
        spoofed = {"X-Tenure-Session": "alpha", "X-Session-ID": "someone-else"}
        assert http.post(CHAT, json=_body(), headers=spoofed).is_success
        sent = fake.received[-1].headers
        # The engine's own session id, derived from tenant and session (never the raw value).
        assert sent["x-session-id"] == engine_session_id("default", "alpha")
        assert sent["x-dynamo-session-id"] == engine_session_id("default", "alpha")
        assert fake.received[-1].body["session_id"] == engine_session_id("default", "alpha")
        # An inferred session (no header at all) is routed by its inferred id too.
        assert http.post(CHAT, json=_body("inferred")).is_success
        inferred = fake.received[-1]
        scoped = inferred.body["kv_transfer_params"]["tenure"]["session_id"]
        assert inferred.headers["x-session-id"] == engine_session_id(*scoped.split("/", 1))
        # Untracked traffic (a passthrough route) gets none, and the client's is dropped.
        http.get("/v1/models", headers={"X-Session-ID": "mine"})
        assert "x-session-id" not in fake.received[-1].headers


def test_single_engine_default_sets_vllms_own_session_field(upstream, sidecar):
    """No router headers configured: X-Session-ID (vLLM's own) is still set, and a client's
    body ``session_id`` is replaced, never forwarded."""
    fake, _ = upstream
    with httpx.Client(base_url=sidecar.url, timeout=10) as http:
        body = {**_body(), "session_id": "client-raw"}
        assert http.post(CHAT, json=body, headers={"X-Tenure-Session": "alpha"}).is_success
        sent = fake.received[-1]
        assert sent.headers["x-session-id"] == engine_session_id("default", "alpha")
        assert sent.body["session_id"] == engine_session_id("default", "alpha")
        assert "client-raw" not in str(sent.body)


def test_bad_header_names_are_refused():
    import pytest

    from tenure.service.settings import SettingsError, load_settings

    with pytest.raises(SettingsError, match="upstream_session_headers"):
        load_settings(dev_mode=True, upstream_session_headers="X-Session-ID,bad name")
