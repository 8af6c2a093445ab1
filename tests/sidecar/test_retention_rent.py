"""The sidecar's rent clock per tenant (re-priced host timers), against a real Redis.

The lease holder keeps each tenant's clock in the tenant's view doc, loads it on every
refresh and only moves it forward (across refreshes, a leader change and a clock that reads
earlier); a bad or lost doc restarts it at zero. A ttl-branch suspension carries
``host_rent_limit`` (in the reply, the record, the pushed decision), the snapshot carries the
clock, a pinned lambda re-prices it, and one tenant's suspensions never charge another's clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from tenure.service.api.retention.controller import RetentionControl
from tenure.service.api.retention.types import RetentionKnobs
from tenure.service.metrics import Metrics
from tenure.service.policy.retention import PriceVector, alpha2, host_ttl_seconds
from tenure.service.settings import TenantSpec
from tenure.service.state.breaker import Breaker
from tenure.service.state.config import RuntimeConfig
from tenure.service.state.keys import Keys
from tenure.service.state.records import StoreLimits
from tenure.service.state.retention_store import RetentionStore
from tenure.service.state.store import StateStore
from tenure.service.wire.push import Decision, Hello, Snapshot

ADMIN = {"Authorization": "Bearer test-admin-token"}
ALPHA = {"Authorization": "Bearer key-a"}
BETA = {"Authorization": "Bearer key-b"}
PRICE = PriceVector(0.0176, 0.02, 1.91)  # the sidecar's default vector
BUDGET = PRICE.beta3 - PRICE.beta2


def _pinned(lam: float) -> RuntimeConfig:
    # Two slots for two tenants: C2 = 1 each, lambda_crit = 0.1/s at W_ref 10 s.
    return RuntimeConfig.model_validate(
        {"host_slots": 2, "w_ref_s": 10, "lambda_mode": "fixed", "lambda_fixed_per_s": lam}
    )


def _rate(lam: float) -> float:
    return alpha2(lam, 1, 10, PRICE.beta3)


class Replica:
    def __init__(self, control: RetentionControl, store: StateStore, now: list[float]) -> None:
        self.control, self.store, self.now = control, store, now

    async def refresh_at(self, at: float, config: RuntimeConfig) -> None:
        self.now[0] = at
        await self.control.refresh(config)

    def clock(self, tenant: str = "alpha") -> Any:
        """(accrued, at, rate) of ``tenant``'s clock as this replica sees it."""
        view = self.control.view(tenant)
        return view.rent_accrued, view.rent_at, view.rent_rate


@pytest.fixture
async def replicas(redis_url: str) -> AsyncIterator[Callable[[str], Replica]]:
    """Sidecar replicas' controllers on one real Redis, each with a clock the test sets."""
    opened: list[tuple[StateStore, aioredis.Redis]] = []

    def make(owner: str) -> Replica:
        client = aioredis.Redis.from_url(redis_url)
        store = StateStore(client, Keys("rent"), Breaker(1.0), StoreLimits())
        opened.append((store, client))
        now = [0.0]
        control = RetentionControl(
            RetentionStore(store, window=2000), Metrics(CollectorRegistry()).retention,
            tenants=["alpha", "beta"], clock=lambda: now[0], knobs=RetentionKnobs(),
            owner=owner,
        )  # fmt: skip
        return Replica(control, store, now)

    try:
        yield make
    finally:
        for store, client in opened:
            await store.aclose()
            await client.aclose()


async def test_the_clock_persists_across_refreshes_and_a_leader_change_and_only_moves_forward(
    replicas: Callable[[str], Replica],
) -> None:
    a, b = replicas("a"), replicas("b")
    rate = _rate(2.0)
    await a.refresh_at(1000.0, _pinned(2.0))
    assert a.control.leader and a.clock() == (0.0, 1000.0, pytest.approx(rate))
    await a.refresh_at(1100.0, _pinned(2.0))
    assert a.clock() == (pytest.approx(100 * rate), 1100.0, pytest.approx(rate))
    # A follower reads the holder's clock from the view doc.
    await b.refresh_at(1100.0, _pinned(2.0))
    assert not b.control.leader and b.clock() == a.clock()
    # The holder dies and its lease lapses: the new holder continues the same clock.
    await a.store.client.delete(a.control.store.lease_key)
    await b.refresh_at(1200.0, _pinned(2.0))
    assert b.control.leader
    assert b.clock() == (pytest.approx(200 * rate), 1200.0, pytest.approx(rate))
    # Its wall clock reads earlier than the last re-pricing: nothing charged is taken back.
    await b.refresh_at(1150.0, _pinned(2.0))
    assert b.clock() == (pytest.approx(200 * rate), 1200.0, pytest.approx(rate))
    # A new pinned lambda re-prices from now on; the past stays at the old price.
    await b.refresh_at(1300.0, _pinned(4.0))
    assert b.clock() == (pytest.approx(300 * rate), 1300.0, pytest.approx(_rate(4.0)))
    await b.refresh_at(1310.0, _pinned(4.0))
    assert b.clock()[0] == pytest.approx(300 * rate + 10 * _rate(4.0))
    # Each tenant has its own clock (both pinned alike here, so both priced alike).
    assert b.clock("beta") == pytest.approx(b.clock("alpha"))


@pytest.mark.parametrize(
    "bad",
    [{"rent_accrued": -1.0}, {"rent_rate": "fast"}, {"rent_at": True}, {"rent_accrued": None}],
)
async def test_a_bad_or_lost_clock_restarts_at_zero(
    replicas: Callable[[str], Replica], bad: dict[str, Any]
) -> None:
    a = replicas("a")
    await a.refresh_at(1000.0, _pinned(2.0))
    await a.refresh_at(1100.0, _pinned(2.0))
    doc = await a.control.store.get_state("alpha")
    assert doc is not None and doc["rent_accrued"] > 0
    await a.control.store.put_state("alpha", {**doc, **bad})
    await a.refresh_at(1200.0, _pinned(2.0))
    # A fresh clock reads lower: a copy held with a limit on the old one waits longer.
    assert a.clock() == (0.0, 1200.0, pytest.approx(_rate(2.0)))
    assert a.clock("beta")[0] == pytest.approx(200 * _rate(2.0))  # the other tenant's is kept
    await a.store.client.flushdb()  # Redis lost everything
    await a.refresh_at(1300.0, _pinned(2.0))
    assert a.clock() == (0.0, 1300.0, pytest.approx(_rate(2.0)))


async def test_an_admin_decision_is_not_undone_by_a_refresh_in_flight(
    replicas: Callable[[str], Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: the periodic refresh read alpha's view, then (a slow Redis round trip on a
    loaded host) an admin's ``decide`` chose ``retain`` from the calibration sample, and the
    refresh then wrote back its own choice made from the view it had read: ``ttl``. One
    re-choice at a time: the admin's decision waits for the refresh and is the one kept."""
    a = replicas("a")
    await a.refresh_at(1000.0, _pinned(2.0))
    assert a.control.view("alpha").branch == "ttl"
    a.now[0] = 1000.0 + RetentionKnobs().period_s + 1  # the next refresh re-chooses
    store = a.control.store
    read, release = asyncio.Event(), asyncio.Event()
    real_get_state = store.get_state

    async def slow_get_state(tenant: str) -> dict[str, Any] | None:
        doc = await real_get_state(tenant)
        if tenant == "alpha" and not read.is_set():  # the refresh's read, held up
            read.set()
            await release.wait()
        return doc

    monkeypatch.setattr(store, "get_state", slow_get_state)
    refresh = asyncio.create_task(a.control.refresh(_pinned(2.0)))
    await read.wait()
    decide = asyncio.create_task(a.control.decide_now("alpha", _pinned(2.0), [5.0] * 50))
    # Give the admin's decision the chance to finish inside the refresh's window (it did
    # before the fix); with the fix it waits for the refresh whatever this allows.
    await asyncio.wait({decide}, timeout=2.0)
    release.set()
    decision = await decide
    await refresh
    assert decision is not None and decision.branch == "retain", decision
    assert a.control.view("alpha").branch == "retain"
    stored = await real_get_state("alpha")
    assert stored is not None and stored["branch"] == "retain", stored


async def test_a_refresh_in_flight_never_puts_back_the_config_an_admin_replaced(
    replicas: Callable[[str], Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23: a refresh read the config document just before ``PATCH /admin/config``
    wrote it, resumed after the PATCH had set the new config, and put the old one back until
    the next refresh (a decision made in between priced with the old host slots)."""
    from tenure.service.api.turns.runtime import Runtime

    a = replicas("a")
    runtime = Runtime(
        a.store, Metrics(CollectorRegistry()), gap_log_len=10, tenants=["alpha", "beta"],
        retention=a.control, clock=lambda: a.now[0],
    )  # fmt: skip
    await a.store.update_config(lambda _: RuntimeConfig().model_dump())
    read, release = asyncio.Event(), asyncio.Event()
    real_get_config = a.store.get_config

    async def slow_get_config() -> dict[str, Any] | None:
        doc = await real_get_config()
        read.set()
        await release.wait()
        return doc

    monkeypatch.setattr(a.store, "get_config", slow_get_config)
    refresh = asyncio.create_task(runtime.refresh())
    await read.wait()  # the refresh holds the old document
    runtime.config = _pinned(2.0)  # what PATCH /admin/config does after its write
    release.set()
    await refresh
    assert runtime.config == _pinned(2.0)
    assert a.control.config == _pinned(2.0)


def _views(http: httpx.Client) -> dict[str, dict[str, Any]]:
    doc = http.get("/admin/retention", headers=ADMIN).json()
    return {t["tenant"]: t for t in doc["tenants"]}


def _idle(http: httpx.Client, who: dict[str, str], names: list[str]) -> None:
    root = f"root-{names[0]}"
    body = {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
    http.post("/v1/chat/completions", json=body, headers={**who, "X-Tenure-Session": root})
    for _ in range(250):
        if http.get(f"/v1/sessions/{root}", headers=who).json().get("state") == "idle":
            break
        time.sleep(0.02)
    for name in names:
        reply = http.post(f"/v1/sessions/{root}/workers", json={"worker_id": name}, headers=who)
        assert reply.status_code == 201, reply.text


def _wait(http: httpx.Client, check: Callable[[dict[str, dict[str, Any]]], bool]) -> dict[str, Any]:
    for _ in range(200):
        views = _views(http)
        if check(views):
            return views
        time.sleep(0.05)
    raise AssertionError(f"the retention view never got there: {_views(http)}")


def test_suspensions_carry_the_limit_and_one_tenant_never_charges_anothers_clock(
    sidecar_factory: Any,
) -> None:
    from tests.sidecar.fake_upstream import free_port
    from tests.sidecar.test_push import Peer

    addr = f"tcp://127.0.0.1:{free_port()}"
    server = sidecar_factory(
        tenants={"key-a": TenantSpec(name="alpha"), "key-b": TenantSpec(name="beta")},
        push_addr=addr, push_snapshot_interval_s=60,
    )  # fmt: skip
    peer = Peer(addr)
    try:
        with httpx.Client(base_url=server.url, timeout=10) as http:
            patch = {"host_slots": 2, "w_ref_s": 10}
            assert http.patch("/admin/config", json=patch, headers=ADMIN).status_code == 200
            _idle(http, ALPHA, [f"a{i}" for i in range(31)])
            _idle(http, BETA, ["b0"])
            # Alpha floods suspensions: its estimated lambda passes its lambda_crit (0.1/s).
            for i in range(30):
                assert http.post(f"/v1/sessions/a{i}/suspend", headers=ALPHA).is_success
            views = _wait(http, lambda v: v["alpha"]["rent_rate_gpu_s_per_s"] > 0)
            alpha, beta = views["alpha"], views["beta"]
            lam = alpha["lambda_in_use_per_s"]
            assert alpha["rent_rate_gpu_s_per_s"] == pytest.approx(_rate(lam), rel=1e-6)
            # Beta saw none of it: its clock charges nothing and has accrued nothing.
            assert beta["rent_rate_gpu_s_per_s"] == 0.0 and beta["rent_now_gpu_s"] == 0.0
            assert beta["rent_at"] is not None  # priced (at zero) by the holder all the same

            before = _views(http)["alpha"]["rent_now_gpu_s"]
            body = http.post("/v1/sessions/a30/suspend", headers=ALPHA).json()
            after = _views(http)["alpha"]["rent_now_gpu_s"]
            assert body["reason"] == "host_ttl" and body["host_ttl_s"] is not None
            assert before + BUDGET <= body["host_rent_limit"] <= after + BUDGET + 1e-9
            record = http.get("/v1/sessions/a30", headers=ALPHA).json()
            assert record["host_rent_limit"] == body["host_rent_limit"]
            # Beta's suspension, uncongested: no timer now, but a limit (re-priced if its
            # price ever rises).
            body_b = http.post("/v1/sessions/b0/suspend", headers=BETA).json()
            assert body_b["host_ttl_s"] is None and body_b["host_rent_limit"] == BUDGET
            # Both decisions went out with their limits.
            peer.send(Hello(adapter_id="rent-test"))
            snap: Snapshot = peer.receive(Snapshot)
            limits = {d.session_id: d.host_rent_limit for d in snap.decisions}
            assert limits["alpha/a30"] == body["host_rent_limit"]
            assert limits["beta/b0"] == BUDGET
            assert snap.config.retention["beta"].rent_rate == 0.0
            assert snap.config.retention["alpha"].rent_rate > 0
            assert snap.config.retention["alpha"].rent_at is not None
            metrics = http.get("/metrics").text
            assert 'tenure_retention_rent_rate_gpu_seconds_per_second{tenant="beta"} 0.0' in metrics
            assert 'tenure_retention_rent_accrued_gpu_seconds{tenant="alpha"}' in metrics

            # An SRE pins lambda: the holder re-prices at the next refresh, and the rate change
            # goes out at once (a fresh snapshot, not the 60 s periodic one).
            accrued = _views(http)["alpha"]["rent_now_gpu_s"]
            pin = {"lambda_mode": "fixed", "lambda_fixed_per_s": 1.0}
            assert http.patch("/admin/config", json=pin, headers=ADMIN).status_code == 200
            views = _wait(
                http,
                lambda v: all(
                    t["rent_rate_gpu_s_per_s"] == pytest.approx(_rate(1.0)) for t in v.values()
                ),
            )
            assert views["alpha"]["rent_now_gpu_s"] >= accrued
            pushed = peer.receive(Snapshot, timeout_s=5)
            while pushed.config.retention["alpha"].rent_rate != pytest.approx(_rate(1.0)):
                pushed = peer.receive(Snapshot, timeout_s=5)
            ttl = host_ttl_seconds(1.0, PRICE, 1, 10)
            body = http.post("/v1/sessions/a0/suspend", headers=ALPHA).json()
            assert body["host_ttl_s"] == pytest.approx(ttl)
            decision: Decision = peer.receive(Decision)
            while decision.session_id != "alpha/a0":
                decision = peer.receive(Decision)
            assert decision.host_rent_limit == body["host_rent_limit"]
    finally:
        peer.close()
