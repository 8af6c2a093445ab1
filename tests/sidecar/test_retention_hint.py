"""A client-declared retention (``cache_control`` TTL on ``/v1/messages``) caps that session's
host TTL while the tier is congested, through the real sidecar and a real Redis; it never
reaches the tenant's controller nor any other tenant."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tenure.service.policy.retention import PriceVector, host_ttl_seconds
from tenure.service.settings import TenantSpec

ADMIN = {"Authorization": "Bearer test-admin-token"}
ALPHA = {"Authorization": "Bearer key-a"}
BETA = {"Authorization": "Bearer key-b"}
W_REF = 3600.0
#: Two host slots shared by two tenants: one each, lambda_crit = 1 / 3600 per tenant.
LAM = 2 / W_REF


def _turn(http: httpx.Client, who: dict[str, str], session: str, ttl: str | None) -> None:
    block: dict[str, Any] = {"type": "text", "text": f"approve the change? {session}"}
    if ttl is not None:
        block["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    body = {"model": "echo", "max_tokens": 8, "messages": [{"role": "user", "content": [block]}]}
    reply = http.post("/v1/messages", json=body, headers={**who, "X-Tenure-Session": session})
    assert reply.status_code == 200, reply.text
    for _ in range(250):  # the end of the turn is recorded after the answer
        record = http.get(f"/v1/sessions/{session}", headers=who).json()
        if record.get("state") == "idle":
            return
        time.sleep(0.02)
    raise AssertionError(f"session {session} never went idle")


def _suspend(http: httpx.Client, who: dict[str, str], session: str) -> dict[str, Any]:
    reply = http.post(f"/v1/sessions/{session}/suspend", headers=who)
    assert reply.status_code == 200, reply.text
    doc: dict[str, Any] = reply.json()
    return doc


def _views(http: httpx.Client) -> dict[str, dict[str, Any]]:
    doc = http.get("/admin/retention", headers=ADMIN).json()
    return {t["tenant"]: t for t in doc["tenants"]}


def test_a_declared_retention_caps_only_its_own_sessions_hold(sidecar_factory) -> None:
    server = sidecar_factory(
        tenants={"key-a": TenantSpec(name="alpha"), "key-b": TenantSpec(name="beta")}
    )
    t2 = host_ttl_seconds(LAM, PriceVector(0.0176, 0.02, 1.91), 1, W_REF)
    assert t2 is not None and 3000 < t2 < 3600
    with httpx.Client(base_url=server.url, timeout=10) as http:
        patch = {"host_slots": 2, "w_ref_s": W_REF, "lambda_mode": "fixed",
                 "lambda_fixed_per_s": LAM}  # fmt: skip
        assert http.patch("/admin/config", json=patch, headers=ADMIN).status_code == 200
        _turn(http, BETA, "b-plain", None)
        beta_first = _suspend(http, BETA, "b-plain")
        assert beta_first["host_ttl_s"] == pytest.approx(t2, rel=1e-6)
        beta_before = _views(http)["beta"]

        # Alpha's client asks for 5 minutes: its suspension is held no longer.
        _turn(http, ALPHA, "a-short", "5m")
        assert http.get("/v1/sessions/a-short", headers=ALPHA).json()["state"] == "idle"
        short = _suspend(http, ALPHA, "a-short")
        assert short["host_ttl_s"] == 300.0 and short["reason"] == "client_retention"
        assert short["host_rent_limit"] is None  # a declared bound stays a fixed timer
        # An hour is longer than t2: the controller's timer stands (a hint only shortens).
        _turn(http, ALPHA, "a-long", "1h")
        long = _suspend(http, ALPHA, "a-long")
        assert long["host_ttl_s"] == pytest.approx(t2, rel=1e-6) and long["reason"] == "host_ttl"
        assert long["host_rent_limit"] is not None  # the controller's timer is re-priced
        # A turn straight from the suspension (no resume call) clears both timers.
        _turn(http, ALPHA, "a-long", None)
        record = http.get("/v1/sessions/a-long", headers=ALPHA).json()
        assert record["host_ttl_s"] is None and record["host_rent_limit"] is None
        # The next turn declares nothing: the bound is gone, not kept from a stale hint.
        assert http.post("/v1/sessions/a-short/resume", headers=ALPHA).status_code == 200
        _turn(http, ALPHA, "a-short", None)
        again = _suspend(http, ALPHA, "a-short")
        assert again["host_ttl_s"] == pytest.approx(t2, rel=1e-6)

        # Beta: same timer, same controller view, whatever alpha's clients declared.
        _turn(http, BETA, "b-next", None)
        assert _suspend(http, BETA, "b-next")["host_ttl_s"] == beta_first["host_ttl_s"]
        beta_after = _views(http)["beta"]
        for key in ("branch", "host_ttl_s", "lambda_in_use_per_s", "host_slots"):
            assert beta_after[key] == beta_before[key], key
        # Alpha's own controller is not moved by the hint either: it prices its tenant's
        # timer from lambda and C2 alone.
        alpha = _views(http)["alpha"]
        assert alpha["host_ttl_s"] == pytest.approx(t2, rel=1e-6)

        # Uncongested: holding is free, the declaration changes nothing.
        calm = {"lambda_fixed_per_s": 0.5 / W_REF}
        assert http.patch("/admin/config", json=calm, headers=ADMIN).status_code == 200
        _turn(http, ALPHA, "a-calm", "5m")
        free = _suspend(http, ALPHA, "a-calm")
        assert free["host_ttl_s"] is None and free["reason"] == "host_retain"
