"""A LangGraph graph whose human-approval gate suspends the Tenure session while it waits."""

import os
from typing import TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from openai import OpenAI

from tenure.clients import TenureSession
from tenure.clients.langgraph import interrupt

sidecar = os.environ.get("TENURE_URL", "http://127.0.0.1:8080")
model = os.environ.get("MODEL", "Qwen/Qwen3-8B")
client = OpenAI(base_url=f"{sidecar}/v1", api_key=os.environ.get("TENURE_API_KEY", "sk-local"))
session = TenureSession(client, session_id="lg-42")


class State(TypedDict, total=False):
    plan: str
    approved: bool


def plan(state: State) -> State:
    reply = session.chat(model=model, messages=[{"role": "user", "content": "Plan the fix."}])
    return {"plan": reply.choices[0].message.content or ""}


def approve(state: State) -> State:
    # Pauses the graph and suspends the session (its KV goes to the host tier, priced for a
    # ten-minute wait); resuming the graph resumes the session.
    answer = interrupt(session, {"apply": state["plan"]}, expected_wait_s=600)
    return {"approved": answer == "yes"}


def apply(state: State) -> State:
    session.chat(model=model, messages=[{"role": "user", "content": "Apply it."}], last_turn=True)
    return {}


graph = StateGraph(State)
graph.add_node("plan", plan)
graph.add_node("approve", approve)
graph.add_node("apply", apply)
graph.add_edge(START, "plan")
graph.add_edge("plan", "approve")
graph.add_edge("approve", "apply")
graph.add_edge("apply", END)
app = graph.compile(checkpointer=InMemorySaver())

thread = {"configurable": {"thread_id": "lg-42"}}
app.invoke({}, thread)  # runs until the approval gate: the session is now suspended
print("waiting for approval:", session.info()["state"])
app.invoke(Command(resume="yes"), thread)  # the human said yes: resumed, applied, finished
print("after approval:", session.info()["state"])
