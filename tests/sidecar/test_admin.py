"""Admin REST: bearer auth, validated config shared through Redis, decisions, wait samples."""

from __future__ import annotations

import time

import httpx
import pytest

from tenure.service.settings import SettingsError, load_settings

ADMIN = {"Authorization": "Bearer test-admin-token"}


def test_admin_requires_the_bearer_token(client):
    assert client.get("/admin/config").status_code == 401
    assert client.get("/admin/config", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.get("/admin/decisions", headers={"Authorization": "Basic x"}).status_code == 401
    reply = client.get("/admin/config", headers=ADMIN)
    assert reply.status_code == 200
    assert reply.json()["policy_mode"] == "tenure"


def test_empty_token_refused_unless_dev_mode(monkeypatch):
    monkeypatch.delenv("TENURE_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("TENURE_DEV_MODE", raising=False)
    with pytest.raises(SettingsError, match="TENURE_ADMIN_TOKEN"):
        load_settings()
    monkeypatch.setenv("TENURE_DEV_MODE", "1")
    assert load_settings().dev_mode is True


def test_settings_repr_and_errors_hide_secrets():
    settings = load_settings(
        admin_token="s3cret-token",
        redis_url="redis://:pw-123@h:6379/0",
        upstream_api_key="up-key-9",
        tenants={"sk-tenant-key": {"name": "acme"}},
    )
    text = repr(settings) + str(settings)
    for secret in ("s3cret-token", "pw-123", "up-key-9", "sk-tenant-key"):
        assert secret not in text
    with pytest.raises(SettingsError) as error:
        load_settings(admin_token="t", tenants={"sk-tenant-key": {"name": "bad name"}})
    assert "sk-tenant-key" not in str(error.value)
    assert "tenants.<api-key>.name" in str(error.value)


def test_dev_mode_opens_admin(sidecar_factory):
    server = sidecar_factory(admin_token="", dev_mode=True)
    with httpx.Client(base_url=server.url) as http:
        assert http.get("/admin/config").status_code == 200


def test_patch_validates_and_names_the_field(client):
    cases = [
        ({"host_slots": -1}, "host_slots"),
        ({"w_ref_s": 0}, "w_ref_s"),
        ({"policy_mode": "fifo"}, "policy_mode"),
        ({"price": {"beta2_gpu_s": 5.0, "beta3_gpu_s": 1.0}}, "beta3_gpu_s"),
        ({"host_capacity_bytes": {"cpu": -3}}, "host_capacity_bytes"),
        ({"lambda_mode": "fixed"}, "lambda_fixed_per_s"),
        ({"surprise": 1}, "surprise"),
        ({"overdue_slack_s": "soon"}, "overdue_slack_s"),
    ]
    for patch, field in cases:
        reply = client.patch("/admin/config", json=patch, headers=ADMIN)
        assert reply.status_code == 422, patch
        locations = [err["loc"] for err in reply.json()["detail"]]
        assert any(field in [str(p) for p in loc] for loc in locations), (patch, locations)
    # Nothing of the rejected patches was stored.
    assert client.get("/admin/config", headers=ADMIN).json()["version"] == 0


def test_patch_is_shared_by_replicas(sidecar_factory):
    """Two sidecars on one Redis: a PATCH through one is what the other serves."""
    one, two = sidecar_factory(), sidecar_factory()
    with (
        httpx.Client(base_url=one.url, headers=ADMIN) as a,
        httpx.Client(base_url=two.url, headers=ADMIN) as b,
    ):
        patched = a.patch(
            "/admin/config",
            json={
                "host_capacity_bytes": {"cpu": 1 << 30},
                "policy_mode": "lru",
                "price": {"beta2_gpu_s": 0.05},
            },
        ).json()
        assert patched["version"] == 1
        assert patched["price"]["beta2_gpu_s"] == 0.05
        assert patched["price"]["beta3_gpu_s"] == pytest.approx(1.91)
        seen = b.get("/admin/config").json()
        assert seen["policy_mode"] == "lru"
        assert seen["host_capacity_bytes"] == {"cpu": 1 << 30}


def test_replicas_share_sessions_and_one_decision_sequence(sidecar_factory):
    one, two = sidecar_factory(), sidecar_factory()
    with httpx.Client(base_url=one.url) as a, httpx.Client(base_url=two.url) as b:
        chat = {"model": "echo", "messages": [{"role": "user", "content": "x"}]}
        for i in range(4):
            (a if i % 2 == 0 else b).post(
                "/v1/chat/completions", json=chat, headers={"X-Tenure-Session": "shared"}
            )
        deadline = time.monotonic() + 5
        while a.get("/v1/sessions/shared").json()["state"] != "idle":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert b.get("/v1/sessions/shared").json()["turn"] == 4
        decisions = b.get("/admin/decisions", headers=ADMIN).json()["decisions"]
        seqs = sorted(d["seq"] for d in decisions)
        assert seqs == list(range(1, len(seqs) + 1))


def test_wait_samples_upload(client):
    reply = client.post("/admin/waits", json={"waits_s": [30, 60, 3600]}, headers=ADMIN)
    assert reply.status_code == 200
    assert reply.json() == {"stored": 3, "total": 3}
    bad = client.post("/admin/waits", json={"waits_s": [-1]}, headers=ADMIN)
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"][-1] == "waits_s"
