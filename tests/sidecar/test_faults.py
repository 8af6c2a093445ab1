"""Fault tests with real processes: redis-server killed during a run of proxied requests."""

from __future__ import annotations

import threading

import httpx

from tests.conftest import wait_for

CHAT = "/v1/chat/completions"


def _chat():
    return {"model": "echo", "messages": [{"role": "user", "content": "go"}]}


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_redis_killed_mid_run(upstream, sidecar_factory, redis_process_factory):
    """Fail open for proxying, 503 + Retry-After for lifecycle writes, recovery without restart,
    and the sessions stored before the crash are intact afterwards."""
    fake, _ = upstream
    redis_server = redis_process_factory(persistent=True)
    sidecar = sidecar_factory(redis_url=redis_server.url, redis_retry_after_s=0.3)
    http = httpx.Client(base_url=sidecar.url, timeout=10)
    try:
        for session in ("alpha", "beta"):
            for _ in range(2):
                assert http.post(
                    CHAT, json=_chat(), headers={"X-Tenure-Session": session}
                ).is_success
        wait_for(
            lambda: http.get("/v1/sessions/alpha").json()["state"] == "idle",
            timeout_s=10.0,
            interval_s=0.05,
        )
        assert http.post("/v1/sessions/beta/suspend", json={"expected_wait_s": 60}).is_success
        before = {s: http.get(f"/v1/sessions/{s}").json() for s in ("alpha", "beta")}

        statuses: list[int] = []
        stop = threading.Event()

        def drive() -> None:
            with httpx.Client(base_url=sidecar.url, timeout=10) as load:
                while not stop.is_set():
                    reply = load.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "gamma"})
                    statuses.append(reply.status_code)

        driver = threading.Thread(target=drive)
        driver.start()
        wait_for(lambda: len(statuses) >= 5, timeout_s=10.0, interval_s=0.05)
        redis_server.stop()  # SIGKILL, mid-run
        during = len(statuses)
        wait_for(lambda: len(statuses) >= during + 20, timeout_s=10.0, interval_s=0.05)

        # Lifecycle writes (and reads) answer 503 with Retry-After while Redis is down.
        refused = http.post("/v1/sessions/alpha/end")
        assert refused.status_code == 503
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["code"] == "state_unavailable"
        assert http.get("/v1/sessions/alpha").status_code == 503
        degraded = fake.received[-1].body["kv_transfer_params"]["tenure"]
        assert degraded == {
            "session_id": "default/gamma",
            "turn": 0,
            "last_turn": False,
            "degraded": True,
        }

        redis_server.start()  # same port; the sidecar is not restarted
        wait_for(
            lambda: http.get("/v1/sessions/alpha").status_code == 200,
            timeout_s=10.0,
            interval_s=0.05,
        )
        stop.set()
        driver.join(timeout=10)

        assert statuses and set(statuses) == {200}, set(statuses)
        metrics = http.get("/metrics").text
        assert _metric(metrics, "tenure_fail_open_total") >= 20
        assert _metric(metrics, "tenure_redis_errors_total") >= 1

        after = {s: http.get(f"/v1/sessions/{s}").json() for s in ("alpha", "beta")}
        assert after == before
        # Writes work again, and continue the stored sessions where they were.
        assert http.post(CHAT, json=_chat(), headers={"X-Tenure-Session": "alpha"}).is_success
        assert fake.received[-1].body["kv_transfer_params"]["tenure"]["turn"] == 3
        assert http.post("/v1/sessions/beta/resume").json()["state"] == "idle"
    finally:
        http.close()
