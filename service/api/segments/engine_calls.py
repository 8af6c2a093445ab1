"""The two small calls the sidecar makes to the engine on its own for segment tracking.

* :func:`count_prompt` — the prompt length of a chat request, from vLLM's ``POST /tokenize``
  with the request's own messages, tools and template options: the engine renders it with the
  same template as the completion, so the count is exact. One extra upstream round trip, taken
  only for a turn whose reasoning the sidecar declares before it is generated.
* :func:`notify_return` — a worker that returns through the lifecycle API (not on a request
  marked as its last turn) must still close its segments in the engine, and vLLM 0.32's tiering
  path hears of a session only through its requests: a one-token completion carrying the
  worker's tags and ``last_turn`` is that notice (its prompt fills no block, so it stores
  nothing).

Both degrade: an upstream without ``/tokenize``, an error or a timeout gives ``None`` / False,
and the caller falls back (a lower-bound start; the parent's end closes the worker).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import msgspec

from tenure.service.api.upstream.client import UpstreamClient, UpstreamError

__all__ = ["count_prompt", "notify_return"]

log = logging.getLogger(__name__)

_encode = msgspec.json.Encoder().encode
#: Request fields that change how a chat prompt renders.
_RENDER_FIELDS = (
    "tools",
    "chat_template",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "mm_processor_kwargs",
)


class _Count(msgspec.Struct):
    count: int


_count = msgspec.json.Decoder(_Count)


async def _post(
    upstream: UpstreamClient,
    path: str,
    headers: Sequence[tuple[bytes, bytes]],
    body: dict[str, Any],
    timeout_s: float,
) -> tuple[int, bytes] | None:
    async def call() -> tuple[int, bytes]:
        response = await upstream.send("POST", path, headers, _encode(body))
        try:
            return response.status, await response.read()
        finally:
            await response.close()

    try:
        return await asyncio.wait_for(call(), timeout_s)
    except (UpstreamError, TimeoutError):
        return None


def _json_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    out = [(k, v) for k, v in headers if k.lower() not in (b"content-type", b"content-length")]
    out.append((b"content-type", b"application/json"))
    return out


async def count_prompt(
    upstream: UpstreamClient,
    payload: dict[str, Any],
    headers: Sequence[tuple[bytes, bytes]],
    timeout_s: float = 5.0,
) -> int | None:
    """Tokens of the prompt this chat request will be rendered to; None if not known."""
    body: dict[str, Any] = {"model": payload.get("model"), "messages": payload.get("messages")}
    body.update({name: payload[name] for name in _RENDER_FIELDS if name in payload})
    answer = await _post(upstream, "/tokenize", _json_headers(headers), body, timeout_s)
    if answer is None or answer[0] != 200:
        return None
    try:
        count = _count.decode(answer[1]).count
    except msgspec.DecodeError:
        return None
    return count if count >= 0 else None


async def notify_return(
    upstream: UpstreamClient,
    model: str,
    tenure: dict[str, Any],
    headers: Sequence[tuple[bytes, bytes]],
    timeout_s: float = 30.0,
) -> bool:
    """Tell the engine a worker returned: one token in, one out, with its closing tags."""
    body = {
        "model": model,
        "prompt": [0],
        "max_tokens": 1,
        "kv_transfer_params": {"tenure": tenure},
    }
    answer = await _post(upstream, "/v1/completions", _json_headers(headers), body, timeout_s)
    if answer is None or answer[0] >= 400:
        log.warning("the engine did not take a worker's return notice (%s)", answer and answer[0])
        return False
    return True
