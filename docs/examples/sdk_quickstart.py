import os

from openai import OpenAI

from tenure.clients import TenureSession

sidecar = os.environ.get("TENURE_URL", "http://127.0.0.1:8080")  # tenure serve, not vLLM
client = OpenAI(base_url=f"{sidecar}/v1", api_key="sk-local")  # the key selects the tenant
ask = [{"role": "user", "content": "Fix the failing test in parser.py"}]
with TenureSession(client, session_id="task-42") as session:
    session.chat(model="qwen", messages=ask, expected_gap_s=2.0)  # a ~2 s tool runs next
    session.suspend(reason="human approval", expected_wait_s=600)  # KV to host, TTL priced
    session.resume()  # approved
    session.chat(model="qwen", messages=ask, last_turn=True)  # KV reclaimed at once
