"""A small real ZeroMQ ROUTER peer speaking the push protocol, standing in for the sidecar.

Used where the sidecar itself is not the subject: it records every message adapters send,
answers ``Hello`` / ``ResyncRequest`` with a snapshot of the decisions it has sent (like the
real sidecar), and lets a test push decisions. Runs on its own thread; ``close()`` stops it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from tenure.service.wire.push import (
    Decision,
    Hello,
    Message,
    ResidencyReport,
    ResyncRequest,
    Snapshot,
    TierConfig,
    decode,
    encode,
)
from tests.conftest import poll


class RouterPeer:
    def __init__(self, addr: str = "tcp://127.0.0.1", port: int | None = None) -> None:
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        if port is None:
            port = self._sock.bind_to_random_port(addr)
        else:
            self._sock.bind(f"{addr}:{port}")
        self.port = port
        self.addr = f"{addr}:{port}"
        self.received: list[tuple[bytes, Message]] = []
        self.decisions: dict[str, Decision] = {}
        self.seq = 0
        self.answer_hello = True
        self._lock = threading.Lock()
        self._outbox: list[tuple[bytes | None, Message]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    # --- test API -------------------------------------------------------------------------

    def identities(self) -> list[bytes]:
        with self._lock:
            return list(dict.fromkeys(ident for ident, _ in self.received))

    def messages(self, kind: type) -> list[Any]:
        with self._lock:
            return [m for _, m in self.received if isinstance(m, kind)]

    def decide(
        self, session_id: str, state: Any, *, skip_seq: bool = False, resend: bool = False, **fields
    ) -> Decision:
        """Publish a decision to every adapter heard from (``skip_seq`` simulates a loss,
        ``resend`` repeats the newest decision's sequence number: a duplicate)."""
        with self._lock:
            if not resend:
                self.seq += 2 if skip_seq else 1
            decision = Decision(
                seq=self.seq, session_id=session_id, state=state, issued_at=time.time(), **fields
            )
            self.decisions[session_id] = decision
            self._outbox.append((None, decision))
        return decision

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        return bool(poll(predicate, timeout))

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                seq=self.seq,
                decisions=list(self.decisions.values()),
                config=TierConfig(),
                issued_at=time.time(),
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close(linger=0)
        self._ctx.term()

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if dict(poller.poll(20)):
                while True:
                    try:
                        ident, frame = self._sock.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    message = decode(frame)
                    with self._lock:
                        self.received.append((ident, message))
                    if isinstance(message, Hello | ResyncRequest) and self.answer_hello:
                        self._sock.send_multipart([ident, encode(self.snapshot())])
            with self._lock:
                outbox, self._outbox = self._outbox, []
                targets = list(dict.fromkeys(ident for ident, _ in self.received))
            for dest, message in outbox:
                for target in [dest] if dest is not None else targets:
                    self._sock.send_multipart([target, encode(message)])


def reports(peer: RouterPeer) -> list[ResidencyReport]:
    return peer.messages(ResidencyReport)
