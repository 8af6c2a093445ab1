"""The plain OpenAI SDK, no Tenure SDK: the hints are three headers on each call."""

import os

from openai import OpenAI

sidecar = os.environ.get("TENURE_URL", "http://127.0.0.1:8080")
model = os.environ.get("MODEL", "Qwen/Qwen3-8B")
client = OpenAI(base_url=f"{sidecar}/v1", api_key=os.environ.get("TENURE_API_KEY", "sk-local"))
messages = [{"role": "user", "content": "List the files that import parser.py"}]

# A tool call follows this answer and takes about 1.5 s: keep the session's KV that long.
reply = client.chat.completions.create(
    model=model,
    messages=messages,
    extra_headers={"X-Tenure-Session": "oai-1", "X-Tenure-Expected-Gap-Ms": "1500"},
)
messages += [
    {"role": "assistant", "content": reply.choices[0].message.content or ""},
    {"role": "user", "content": "tool output: parser.py, lexer.py"},
]
# The last turn: the engine reclaims the session's KV as soon as it has answered.
client.chat.completions.create(
    model=model,
    messages=messages,
    extra_headers={"X-Tenure-Session": "oai-1", "X-Tenure-Last-Turn": "true"},
)
