"""The SDK's worker helpers against the real sidecar with segment tracking on: ``spawn`` with the
ranker's spawn facts and ``return_to_parent`` (sync and async alike); the engine is faked at the
network boundary (``Upstream`` of ``test_sdk_against_sidecar``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import uvicorn

from tenure.clients import AsyncTenureSession, TenureLifecycleError, TenureSession, TenureUsageError
from tenure.service.processes import free_port
from tests.clients.test_sdk_against_sidecar import KEY_A, MESSAGES, Sidecar, Upstream


@pytest.fixture
def sidecar(redis_url: str) -> Iterator[Sidecar]:
    from tenure.service.app import create_app
    from tenure.service.settings import load_settings

    upstream = Upstream()
    settings = load_settings(
        redis_url=redis_url,
        upstream_url="http://engine.test",
        admin_token="admin-token-for-tests",
        push_addr="",
        tenants={KEY_A: {"name": "a"}},
        segments=True,
    )
    app = create_app(settings, upstream_transport=httpx.MockTransport(upstream.handle))
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="sidecar", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("sidecar did not start")
        time.sleep(0.02)
    try:
        yield Sidecar(f"http://127.0.0.1:{port}/v1", upstream)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_spawn_with_ranker_facts_and_return(sidecar: Sidecar) -> None:
    client = openai.OpenAI(base_url=sidecar.base_url, api_key=KEY_A, max_retries=0)
    with TenureSession(client, session_id="lead-w") as lead:
        lead.chat(model="m", messages=MESSAGES)
        worker = lead.spawn("lead-w.1", subagent_type="Plan", expected_tokens=9000, model="m")
        worker.chat(model="m", messages=MESSAGES)
        tags = sidecar.upstream.tenure()[-1]
        assert tags["role"] == "worker" and tags["parent_session"] == "a/lead-w"
        assert tags["predicted_lifetime_s"] == pytest.approx(366.8)  # the type heuristic
        assert tags["expected_tokens"] == 9000
        assert worker.return_to_parent()["state"] == "finished"
        notice = sidecar.upstream.tenure()[-1]  # the sidecar's closing notice to the engine
        assert notice["session_id"] == "a/lead-w.1" and notice["last_turn"] is True
        with pytest.raises(TenureUsageError):
            worker.return_to_parent()  # the SDK knows it has returned
        again = TenureSession(client, session_id="lead-w.1", parent="lead-w", end_on_exit=False)
        with pytest.raises(TenureLifecycleError) as err:
            again.return_to_parent()
        assert err.value.status == 409  # and so does the sidecar
        again.close()
        with pytest.raises(TenureUsageError):
            lead.return_to_parent()  # a lead ends, it does not return
        worker.close()


async def test_async_spawn_and_return(sidecar: Sidecar) -> None:
    client = openai.AsyncOpenAI(base_url=sidecar.base_url, api_key=KEY_A, max_retries=0)
    async with AsyncTenureSession(client, session_id="lead-a") as lead:
        await lead.chat(model="m", messages=MESSAGES)
        worker = await lead.spawn("lead-a.1", role="reviewer", subagent_type="Explore")
        await worker.chat(model="m", messages=MESSAGES)
        assert sidecar.upstream.tenure()[-1]["role"] == "reviewer"
        assert (await worker.return_to_parent())["state"] == "finished"
        assert sidecar.session("lead-a.1")["state"] == "finished"
