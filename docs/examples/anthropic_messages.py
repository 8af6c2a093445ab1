"""The Anthropic SDK on /v1/messages (what Claude Code speaks), through the Tenure SDK."""

import os

import anthropic

from tenure.clients import TenureSession

sidecar = os.environ.get("TENURE_URL", "http://127.0.0.1:8080")  # the root: the client adds /v1
model = os.environ.get("MODEL", "Qwen/Qwen3-8B")
client = anthropic.Anthropic(base_url=sidecar, api_key=os.environ.get("TENURE_API_KEY", "sk-local"))
# A cache_control TTL is a retention hint: under congestion it caps how long a suspended
# session's prefix is held on the host tier.
system = [{"type": "text", "text": "You are a coding agent.",
           "cache_control": {"type": "ephemeral", "ttl": "1h"}}]  # fmt: skip
ask = [{"role": "user", "content": "Why does test_parse fail?"}]

with TenureSession(client, session_id="cc-7") as session:
    session.messages(model=model, max_tokens=256, system=system, messages=ask, expected_gap_s=3.0)
    events = session.messages(
        model=model, max_tokens=256, system=system, messages=ask, stream=True, last_turn=True
    )
    for event in events:
        print(event.type)
