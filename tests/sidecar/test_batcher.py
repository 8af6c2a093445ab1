"""The Redis script batcher against a real redis-server: direct when alone, pipelined together."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, ResponseError

from tenure.service.state.batcher import ScriptBatcher

ECHO = """
if ARGV[1] == 'bad' then return redis.error_reply('boom') end
return ARGV[1]
"""


async def test_alone_direct_together_one_pipeline_each_caller_its_own_answer(
    redis_url: str,
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        script = client.register_script(ECHO)
        batcher = ScriptBatcher(client)
        assert await batcher.call(script, [], ["one"]) == "one"
        assert await batcher.call(script, [], ["two"]) == "two"
        assert (batcher.direct_calls, batcher.batched_calls) == (2, 0)

        pipelines = 0
        real_pipeline = client.pipeline

        def counting_pipeline(*args: Any, **kwargs: Any) -> Any:
            nonlocal pipelines
            pipelines += 1
            return real_pipeline(*args, **kwargs)

        client.pipeline = counting_pipeline  # type: ignore[method-assign]
        values = [f"v{i}" for i in range(40)]
        values[17] = "bad"
        results = await asyncio.gather(
            *(batcher.call(script, [], [v]) for v in values), return_exceptions=True
        )
        assert batcher.direct_calls == 3  # the first of the 40 went alone
        assert batcher.batched_calls == 39
        assert pipelines == 1  # the other 39 shared one round trip
        for value, result in zip(values, results, strict=True):
            if value == "bad":
                assert isinstance(result, ResponseError) and "boom" in str(result)
            else:
                assert result == value
    finally:
        await client.aclose()


async def test_a_dead_server_fails_every_caller_and_nobody_hangs() -> None:
    client = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    try:
        script = client.register_script(ECHO)
        batcher = ScriptBatcher(client)
        results = await asyncio.wait_for(
            asyncio.gather(
                *(batcher.call(script, [], [str(i)]) for i in range(5)), return_exceptions=True
            ),
            timeout=10,
        )
        assert all(isinstance(r, ConnectionError) for r in results)
        with pytest.raises(ConnectionError):
            await batcher.call(script, [], ["x"])
    finally:
        await client.aclose()
