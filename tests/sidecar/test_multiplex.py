"""The hot path's pipelined Redis connection against real redis-server processes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tenure.service.state.multiplex import MultiplexedScripts

ECHO = """
if ARGV[1] == 'bad' then return redis.error_reply('ERR boom') end
redis.call('SET', KEYS[1], ARGV[1])
return {KEYS[1], ARGV[1]}
"""
SLOW = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  local n = redis.call('TIME')
until n[1] * 1000000 + n[2] - start > 300000
return 1
"""


def _scripts(url: str, **kw: Any) -> tuple[aioredis.Redis, MultiplexedScripts]:
    client = aioredis.Redis.from_url(url, **kw)
    fast = MultiplexedScripts.for_client(client)
    assert fast is not None
    return client, fast


async def test_concurrent_calls_share_one_connection_and_get_their_own_replies(
    redis_url: str,
) -> None:
    client, fast = _scripts(redis_url)
    try:
        script = client.register_script(ECHO)
        opened = 0
        real_open = fast._open

        async def counting_open() -> Any:
            nonlocal opened
            opened += 1
            return await real_open()

        fast._open = counting_open  # type: ignore[method-assign]
        args = [f"v{i}" for i in range(50)]
        args[7] = "bad"
        replies = await asyncio.gather(
            *(fast.call(script, [f"k{i}"], [a]) for i, a in enumerate(args)),
            return_exceptions=True,
        )
        for i, (arg, reply) in enumerate(zip(args, replies, strict=True)):
            if arg == "bad":
                assert isinstance(reply, ResponseError) and "boom" in str(reply)
            else:
                assert reply == [f"k{i}".encode(), arg.encode()]
        assert opened == 1  # fifty calls in flight together, one connection
    finally:
        await fast.aclose()
        await client.aclose()


async def test_a_flushed_script_cache_is_refilled_with_eval(redis_url: str) -> None:
    client, fast = _scripts(redis_url)
    try:
        script = client.register_script(ECHO)
        assert await fast.call(script, ["a"], ["1"]) == [b"a", b"1"]
        await client.script_flush()
        assert await fast.call(script, ["a"], ["2"]) == [b"a", b"2"]
        assert (await client.script_exists(script.sha)) == [True]
    finally:
        await fast.aclose()
        await client.aclose()


async def test_a_slow_reply_times_out_drops_the_connection_and_the_next_call_reconnects(
    redis_url: str,
) -> None:
    client, fast = _scripts(redis_url, socket_timeout=0.1)
    try:
        slow = client.register_script(SLOW)
        echo = client.register_script(ECHO)
        with pytest.raises(RedisTimeoutError):
            await fast.call(slow, [], [])
        # Wait until the server has finished the slow script: Redis runs one script at a
        # time, so another connection's PING is answered only after it.
        waiter = redis.Redis.from_url(redis_url, socket_timeout=5)
        try:
            assert await asyncio.to_thread(waiter.ping)
        finally:
            waiter.close()
        assert await fast.call(echo, ["b"], ["ok"]) == [b"b", b"ok"]
    finally:
        await fast.aclose()
        await client.aclose()


async def test_the_database_in_the_url_is_selected(redis_url: str) -> None:
    url = redis_url.rsplit("/", 1)[0] + "/3"
    client, fast = _scripts(url)
    try:
        await client.flushdb()
        assert await fast.call(client.register_script(ECHO), ["in-db-3"], ["x"])
        assert await client.get("in-db-3") == b"x"
        assert redis.Redis.from_url(redis_url).get("in-db-3") is None  # not in db 0
    finally:
        await client.flushdb()
        await fast.aclose()
        await client.aclose()


async def test_killed_server_fails_calls_then_recovers_without_a_new_client(
    redis_process_factory: Callable[..., Any],
) -> None:
    server = redis_process_factory()
    client, fast = _scripts(server.url, socket_timeout=1.0, socket_connect_timeout=0.5)
    try:
        script = client.register_script(ECHO)
        assert await fast.call(script, ["k"], ["before"]) == [b"k", b"before"]
        server.stop()
        with pytest.raises(ConnectionError):
            await fast.call(script, ["k"], ["during"])
        server.start()
        assert await fast.call(script, ["k"], ["after"]) == [b"k", b"after"]
    finally:
        await fast.aclose()
        await client.aclose()


def test_only_plain_tcp_urls_are_multiplexed_and_the_password_never_shows() -> None:
    assert MultiplexedScripts.for_client(aioredis.Redis.from_url("unix:///tmp/r.sock")) is None
    assert MultiplexedScripts.for_client(aioredis.Redis.from_url("rediss://h:6379/0")) is None
    fast = MultiplexedScripts.for_client(aioredis.Redis.from_url("redis://u:s3cret@h:6380/2"))
    assert fast is not None and "s3cret" not in repr(fast)
