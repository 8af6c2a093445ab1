"""Pure pieces of the sidecar: hint parsing, prefix digests, tenants, the Redis breaker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.exceptions

from tenure.service.api.hints.inference import LOOKBACK, prefix_digests
from tenure.service.api.hints.tenure import MAX_GAP_S, HintError, Hints, parse_hints
from tenure.service.api.tenants import TenantResolver
from tenure.service.api.upstream.relay import (
    _WATCH_AFTER_S,
    ClientGone,
    ProxiedResponse,
    send_or_disconnect,
)
from tenure.service.settings import TenantSpec
from tenure.service.state.breaker import Breaker, StateUnavailable


def test_header_and_body_hints_merge():
    hints = parse_hints(
        {"x-tenure-session": "s-1", "x-tenure-expected-gap-ms": "1500"},
        {"segment": "reasoning", "last_turn": True, "parent": "lead"},
    )
    assert hints == Hints(
        session="s-1", last_turn=True, expected_gap_s=1.5, segment="reasoning", parent="lead"
    )
    assert parse_hints({}, None) == Hints()
    assert not parse_hints({}, {}).any


def test_agreeing_duplicates_are_fine_and_gap_limit_is_inclusive():
    hints = parse_hints({"x-tenure-session": "a"}, {"session_id": "a"})
    assert hints.session == "a"
    limit_ms = str(MAX_GAP_S * 1000)
    assert parse_hints({"x-tenure-expected-gap-ms": limit_ms}, None).expected_gap_s == MAX_GAP_S
    with pytest.raises(HintError) as error:
        parse_hints({"x-tenure-expected-gap-ms": str(MAX_GAP_S * 1000 + 1)}, None)
    assert error.value.param == "X-Tenure-Expected-Gap-Ms"


@pytest.mark.parametrize("value", [True, None, [1], {"ms": 1}, float("inf")])
def test_body_gap_must_be_a_finite_number(value):
    with pytest.raises(HintError) as error:
        parse_hints({}, {"expected_gap_s": value})
    assert error.value.param == "tenure.expected_gap_s"


def test_prefix_digests_link_a_conversation_to_its_extension():
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}]
    second = [*first, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"}]
    d1 = prefix_digests("m", first)
    d2 = prefix_digests("m", second)
    assert d1[0] in d2[1:]  # the extension looks up the earlier request's whole list
    assert prefix_digests("other-model", first)[0] != d1[0]
    assert prefix_digests("m", []) == []
    long = [{"role": "user", "content": str(i)} for i in range(100)]
    assert len(prefix_digests("m", long)) == LOOKBACK + 1


def test_tenant_resolver():
    resolver = TenantResolver({"k1": TenantSpec(name="acme")}, TenantSpec(name="default"))
    assert resolver.resolve("Bearer k1") == TenantSpec(name="acme")
    assert resolver.resolve("bearer  k1 ") == TenantSpec(name="acme")
    assert resolver.resolve("Bearer k2") is None
    assert resolver.resolve(None) is None
    assert "k1" not in repr(resolver)
    open_resolver = TenantResolver({}, TenantSpec(name="default"))
    assert open_resolver.resolve(None) == TenantSpec(name="default")


def test_breaker_fails_fast_then_probes_again():
    now = [100.0]
    errors: list[str] = []
    breaker = Breaker(2.0, on_error=errors.append, clock=lambda: now[0])
    calls = []

    async def failing():
        calls.append(1)
        raise redis.exceptions.ConnectionError("down")

    async def working():
        calls.append(1)
        return "ok"

    async def scenario():
        with pytest.raises(StateUnavailable):
            await breaker.call("op", failing)
        with pytest.raises(StateUnavailable) as error:
            await breaker.call("op", working)  # open: not even tried
        assert error.value.retry_after_s == pytest.approx(2.0)
        assert len(calls) == 1
        now[0] += 2.1
        assert await breaker.call("op", working) == "ok"

    asyncio.run(scenario())
    assert errors == ["op"]
    assert len(calls) == 2


async def test_disconnect_watch_starts_late_and_still_cancels_the_work() -> None:
    calls = 0

    async def gone() -> dict[str, str]:
        nonlocal calls
        calls += 1
        return {"type": "http.disconnect"}

    # Work done before the watcher would start: the client is never even asked.
    assert await send_or_disconnect(asyncio.sleep(0, "done"), gone) == "done"
    assert calls == 0
    # Work that outlives it: the watcher sees the disconnect and cancels it.
    cancelled = asyncio.Event()

    async def engine() -> str:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ClientGone):
        await send_or_disconnect(engine(), gone)
    assert cancelled.is_set() and calls == 1
    assert loop.time() - started >= _WATCH_AFTER_S


async def test_answer_bookkeeping_runs_after_the_answer_even_when_sending_fails() -> None:
    sent: list[str] = []
    seen: list[list[str]] = []

    async def send(message: Any) -> None:
        sent.append(message["type"])

    answer = ProxiedResponse(b"{}", 200, [(b"content-type", b"application/json")],
                             on_sent=lambda: seen.append(list(sent)))  # fmt: skip
    await answer({"type": "http"}, _never, send)
    assert seen == [["http.response.start", "http.response.body"]]
    assert answer.raw_headers[-1] == (b"content-length", b"2")

    async def broken(message: Any) -> None:
        raise OSError("client gone")

    ran: list[bool] = []
    empty = ProxiedResponse(b"", 204, [], on_sent=lambda: ran.append(True))
    with pytest.raises(OSError):
        await empty({"type": "http"}, _never, broken)
    assert ran == [True] and empty.raw_headers == []  # no length on a 204


async def _never() -> Any:
    raise AssertionError("a whole answer never reads from the client")
