"""Minimal HTTP/1.1 pieces for ``tenure bench proxy``: a canned upstream and a load client.

Both are raw asyncio (keep-alive, Content-Length bodies only) so that the benchmark measures the
proxy, not the cost of a general-purpose HTTP stack on either side of it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence

__all__ = ["CANNED_COMPLETION", "CANNED_MESSAGE", "run_load", "serve_upstream"]

CANNED_COMPLETION = json.dumps(
    {
        "id": "cmpl-bench",
        "object": "chat.completion",
        "model": "bench",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9},
    }
).encode()
#: vLLM's answer on ``/v1/messages`` (Anthropic Messages), for ``--route messages``.
CANNED_MESSAGE = json.dumps(
    {
        "id": "msg-bench", "type": "message", "role": "assistant", "model": "bench",
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 8, "output_tokens": 1},
    }
).encode()  # fmt: skip


def _canned(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


_RESPONSE = _canned(CANNED_COMPLETION)
_MESSAGE_RESPONSE = _canned(CANNED_MESSAGE)


class _Upstream(asyncio.Protocol):
    """Answers every request with the canned completion (after reading its whole body)."""

    def __init__(self) -> None:
        self.buffer = b""
        self.transport: asyncio.WriteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TCP transport is not an asyncio.Transport subclass, only duck-typed.
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            length = _content_length(self.buffer[:end])
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            messages = self.buffer.startswith(b"POST /v1/messages ")
            self.buffer = self.buffer[total:]
            assert self.transport is not None
            self.transport.write(_MESSAGE_RESPONSE if messages else _RESPONSE)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


async def serve_upstream(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Upstream, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


async def _one_connection(
    port: int,
    requests: Sequence[bytes],
    latencies: list[float],
    errors: list[str],
    schedule: Sequence[float] | None,
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for index, request in enumerate(requests):
            if schedule is None:
                started = time.perf_counter()
            else:
                # Open loop: latency counts from the scheduled send time, so a proxy that
                # falls behind is charged for the queueing it causes.
                started = schedule[index]
                delay = started - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            body = await reader.readexactly(_content_length(head))
            latencies.append(time.perf_counter() - started)
            if not head.startswith(b"HTTP/1.1 200"):
                errors.append(head.split(b"\r\n", 1)[0].decode() + " " + body[:200].decode())
    finally:
        writer.close()


async def run_load(
    port: int, per_connection: Sequence[Sequence[bytes]], rate_per_s: float | None = None
) -> tuple[list[float], float, list[str]]:
    """Drive one keep-alive connection per request list; returns latencies, elapsed, errors.

    ``rate_per_s=None`` is closed loop (each connection sends as soon as it has its answer:
    throughput); a rate spreads sends evenly over the connections (open loop: latency at a load).
    """
    latencies: list[float] = []
    errors: list[str] = []
    connections = len(per_connection)
    # Open loop: the schedule starts a moment from now, once every connection is open;
    # closed loop: the clock starts now.
    started = time.perf_counter() + (0.05 if rate_per_s is not None else 0.0)
    schedules: list[list[float] | None] = []
    for conn, reqs in enumerate(per_connection):
        if rate_per_s is None:
            schedules.append(None)
        else:
            schedules.append(
                [started + (k * connections + conn) / rate_per_s for k in range(len(reqs))]
            )
    await asyncio.gather(
        *(
            _one_connection(port, reqs, latencies, errors, schedule)
            for reqs, schedule in zip(per_connection, schedules, strict=True)
        )
    )
    return latencies, time.perf_counter() - started, errors


def _main() -> None:
    parser = argparse.ArgumentParser(description="canned OpenAI-compatible upstream")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(serve_upstream(args.port))
    except ImportError:  # pragma: no cover - uvloop is optional
        asyncio.run(serve_upstream(args.port))


if __name__ == "__main__":
    _main()
