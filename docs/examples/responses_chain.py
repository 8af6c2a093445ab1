"""OpenAI Responses (what Codex speaks): a chain by previous_response_id is one session."""

import os

from openai import OpenAI

sidecar = os.environ.get("TENURE_URL", "http://127.0.0.1:8080")
model = os.environ.get("MODEL", "Qwen/Qwen3-8B")
client = OpenAI(base_url=f"{sidecar}/v1", api_key=os.environ.get("TENURE_API_KEY", "sk-local"))

first = client.responses.create(model=model, input="Plan the fix for issue 12.")
# No session header: the sidecar chains this request to the session of `first`.
second = client.responses.create(
    model=model, input="Now write the patch.", previous_response_id=first.id
)
print(first.id, "->", second.id)
