"""A LangGraph ``interrupt()`` gate suspends the session with its wait; the resume resumes it.

A real LangGraph graph (in-memory checkpointer) and the real sidecar on a real Redis; the
engine is the recording fake of ``tests/sidecar/fake_upstream``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypedDict

import httpx
import openai
import pytest

from tenure.clients import TenureSession
from tenure.service.app import create_app
from tenure.service.settings import load_settings
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread

langgraph = pytest.importorskip("langgraph")

from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command  # noqa: E402

from tenure.clients.langgraph import interrupt  # noqa: E402


class State(TypedDict, total=False):
    plan: str
    approved: str


@pytest.fixture
def sidecar(redis_url: str) -> Iterator[str]:
    engine = ServerThread(FakeUpstream()).start()
    settings = load_settings(
        redis_url=redis_url, upstream_url=engine.url, admin_token="admin-token-for-tests",
        push_addr="",
    )  # fmt: skip
    server = ServerThread(create_app(settings)).start()
    try:
        yield server.url
    finally:
        server.stop()
        engine.stop()


def _record(url: str, session: str) -> dict[str, Any]:
    record: dict[str, Any] = httpx.get(f"{url}/v1/sessions/{session}", timeout=10).json()
    return record


def test_interrupt_suspends_and_resume_resumes(sidecar: str) -> None:
    client = openai.OpenAI(base_url=f"{sidecar}/v1", api_key="sk-any", max_retries=0)
    session = TenureSession(client, session_id="lg-1", end_on_exit=False)

    def plan(state: State) -> State:
        reply = session.chat(model="echo", messages=[{"role": "user", "content": "plan"}])
        return {"plan": reply.choices[0].message.content or ""}

    def approve(state: State) -> State:
        answer = interrupt(session, {"apply": state["plan"]}, expected_wait_s=600)
        return {"approved": str(answer)}

    builder = StateGraph(State)
    builder.add_node("plan", plan)
    builder.add_node("approve", approve)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "approve")
    builder.add_edge("approve", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-1"}}

    paused = graph.invoke({}, config)
    assert "__interrupt__" in paused
    record = _record(sidecar, "lg-1")
    assert record["state"] == "suspended" and record["expected_wait_s"] == 600
    assert record["suspend_reason"].startswith("human approval")

    done = graph.invoke(Command(resume="yes"), config)
    assert done["approved"] == "yes"
    record = _record(sidecar, "lg-1")
    assert record["state"] != "suspended" and record["turn"] == 1
    session.close()
