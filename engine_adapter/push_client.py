"""The adapter end of the push channel: a background thread inside EngineCore.

Protocol: :mod:`tenure.service.wire.push` (a ZeroMQ DEALER here, the sidecar's ROUTER there). The
thread owns the socket and the sequence bookkeeping; it never touches the policy's state. It
hands decisions and snapshots to the scheduler thread through the policy's ``inbox`` (a deque),
and reads counters the scheduler thread writes, so the engine never waits on the channel:

* ``Hello`` at start and whenever nothing was heard for ``hello_interval_s`` (that is how a
  restarted sidecar is noticed; a restarted engine starts a fresh client with ``last_seq -1``);
* ``Decision`` with ``seq <= last_seq`` is a duplicate and dropped; ``seq > last_seq + 1`` is a
  gap: the decision is still applied (the newest per session wins) and a ``ResyncRequest`` sent;
* ``Snapshot`` replaces the decision table; one with a lower ``seq`` than ours means the
  sidecar's sequence restarted, and it is taken as the new baseline;
* ``ResidencyReport`` every ``report_interval_s``: counter deltas since the previous report
  (stores, refusals, evictions by class, loads, bytes) and gauges (resident bytes, sessions);
* ``PlacementReport`` from the engine's ``tenure-fs`` SSD tier, when it has one
  (:meth:`PushClient.report_placement`, :mod:`tenure.engine_adapter.placement_push`).

One engine has one connection (:func:`engine_push_client`: one socket, one thread, one id,
kept on vLLM's offloading spec), whoever in the engine reports over it: Tenure's manager with
its policy, the SSD tier, or both. A connection without a policy (vLLM's own manager over the
``tenure-fs`` tier) reads the sidecar's decisions and snapshots and drops them.

With no sidecar, sends are dropped (``IMMEDIATE``: nothing queues for a peer that is not
there), decisions already received keep applying, and untagged traffic runs tags-off.

Security (the threat model is in :mod:`tenure.service.push.server`): with the sidecar's CURVE public
key (``server_key``, env ``TENURE_PUSH_SERVER_KEY``) the channel is encrypted and only the
holder of the matching secret key can pose as the sidecar and push decisions; the adapter's own
key pair (``client_secret_key``, env ``TENURE_PUSH_CLIENT_SECRET_KEY``; a fresh one when
absent) is what a sidecar with an allow-list of adapter keys checks. Keys are Z85 text.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from tenure.engine_adapter.placement_push import PlacementReports, PlacementTotals
from tenure.engine_adapter.policy import TenureCachePolicy
from tenure.engine_adapter.push_socket import run_connected
from tenure.engine_adapter.settings import CLIENT_SECRET_ENV, SERVER_KEY_ENV, adapter_env
from tenure.service.wire.push import (
    Decision,
    Hello,
    Message,
    ResidencyReport,
    ResyncRequest,
    Snapshot,
    decode,
    encode,
)

__all__ = [
    "CLIENT_SECRET_ENV",
    "SERVER_KEY_ENV",
    "PushClient",
    "engine_push_client",
    "residency_delta",
]


log = logging.getLogger("vllm.tenure.push")

_POLL_MS = 50
_HELLO_RETRY_S = 0.5
#: Send a report at least this often (in report intervals) even when nothing changed.
_KEEPALIVE_REPORTS = 5
_COUNTER_FIELDS = (
    "stores",
    "stored_blocks",
    "refusals",
    "refused_blocks",
    "host_hit_blocks",
    "loads",
    "bytes_stored",
    "bytes_loaded",
    "ttl_expiries",
    "ttl_repriced",
    "cold_sessions",
)
_EVICTED_PREFIX = "evicted_blocks_"


def residency_delta(now: dict[str, int], before: dict[str, int]) -> dict[str, object]:
    """Report fields for the counter change ``before -> now`` (negative deltas clamp to 0)."""
    fields: dict[str, object] = {
        name: max(0, now.get(name, 0) - before.get(name, 0)) for name in _COUNTER_FIELDS
    }
    evicted: dict[str, int] = {}
    for name, value in now.items():
        if name.startswith(_EVICTED_PREFIX):
            delta = value - before.get(name, 0)
            if delta > 0:
                evicted[name[len(_EVICTED_PREFIX) :]] = delta
    fields["evicted_blocks"] = evicted
    return fields


class PushClient:
    """One engine's DEALER connection to the sidecar: its policy's decisions and reports, and
    its SSD tier's placement reports."""

    def __init__(
        self,
        addr: str,
        policy: TenureCachePolicy | None,
        *,
        engine_id: str = "",
        bytes_per_block: int = 0,
        report_interval_s: float = 1.0,
        hello_interval_s: float = 15.0,
        adapter_id: str | None = None,
        wall_clock: Callable[[], float] = time.time,
        waker: Callable[[], None] | None = None,
        server_key: str | None = None,
        client_secret_key: str | None = None,
    ) -> None:
        self.addr = addr
        #: The sidecar's CURVE public key (Z85); None: a plain channel.
        env = adapter_env()
        self.server_key = server_key or env.push_server_key
        self._client_secret = client_secret_key or env.push_client_secret_key
        #: The policy the decisions go to and the residency reports come from (``None``: none
        #: in this engine, as under vLLM's own manager; decisions are dropped).
        self.policy = policy
        #: The SSD tier's placement reports (:meth:`report_placement`).
        self.placement: PlacementReports | None = None
        self.engine_id = engine_id
        self.bytes_per_block = bytes_per_block
        self.report_interval_s = report_interval_s
        self.hello_interval_s = hello_interval_s
        self.adapter_id = (
            adapter_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        self._wall = wall_clock
        #: Wakes an idle engine so queued decisions and due timers apply without new traffic.
        self.waker = waker
        self.started_at = wall_clock()
        #: Highest decision sequence number accepted from the sidecar (network thread's view).
        self.last_seq = -1
        self.last_heard = 0.0
        self.counters: Counter[str] = Counter()
        self._report_seq = 0
        self._reported: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report_placement(
        self, source: Callable[[], PlacementTotals] | None, interval_s: float = 1.0
    ) -> None:
        """Send the ``tenure-fs`` tier's placement reports (from ``source``'s totals, every
        ``interval_s``) on this connection; ``None`` stops them. Callable before or after
        :meth:`start` (the thread reads the reporter once per tick)."""
        self.placement = (
            None if source is None else PlacementReports(source, interval_s, now=time.monotonic())
        )

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tenure-push", daemon=True)
        self._thread.start()
        log.info(
            "tenure push channel: adapter %s -> %s (CURVE %s, idle-engine wake-ups %s)",
            self.adapter_id,
            self.addr,
            "on" if self.server_key is not None else "off",
            "on" if self.waker is not None else "off",
        )

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def connected(self) -> bool:
        """Heard from the sidecar within the last three hello intervals."""
        return self._wall() - self.last_heard < 3 * self.hello_interval_s

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        run_connected(
            self.addr, self._loop, server_key=self.server_key, client_secret=self._client_secret,
            send_hwm=1000, log=log, what="tenure push channel",
        )  # fmt: skip

    def _loop(self, sock: zmq.Socket[bytes]) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        last_hello = -1e18
        hello_sent = False
        next_report = time.monotonic() + self.report_interval_s
        idle_reports = 0
        while not self._stop.is_set():
            now_wall = self._wall()
            if now_wall - self.last_heard > self.hello_interval_s and (
                now_wall - last_hello > (self.hello_interval_s if hello_sent else _HELLO_RETRY_S)
            ):
                # Nothing queues without a connected peer: an unsent Hello is retried soon.
                hello_sent = self._send(sock, self.hello())
                last_hello = now_wall
            if dict(poller.poll(_POLL_MS)):
                while True:
                    try:
                        frame = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._handle(sock, frame)
            policy = self.policy
            if self.waker is not None and policy is not None and policy.has_work(time.monotonic()):
                # Decisions are queued or a timer is due: have the engine step (it applies
                # them on its own thread). At most once per poll tick.
                self.waker()
                self.counters["wakeups"] += 1
            if policy is not None and time.monotonic() >= next_report:
                next_report = time.monotonic() + self.report_interval_s
                report = self.report()
                if report is not None or idle_reports >= _KEEPALIVE_REPORTS:
                    self._send(sock, report or self.report(force=True))
                    idle_reports = 0
                else:
                    idle_reports += 1
            placement = self.placement
            if placement is not None and placement.due(time.monotonic()):
                due = placement.next(time.monotonic(), adapter_id=self.adapter_id, at=self._wall())
                if due is not None and not self._send(sock, due):
                    # No sidecar connected: nothing queues; the deltas go with the next report.
                    placement.unsent()

    def _send(self, sock: zmq.Socket[bytes], message: Message | None) -> bool:
        if message is None:
            return False
        try:
            sock.send(encode(message), zmq.NOBLOCK)
        except zmq.Again:
            self.counters["send_dropped"] += 1  # no sidecar connected: nothing queues
            return False
        self.counters[f"sent_{type(message).__name__}"] += 1
        return True

    def _handle(self, sock: zmq.Socket[bytes], frame: bytes) -> None:
        try:
            message = decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.counters["decode_errors"] += 1
            return
        self.last_heard = self._wall()
        if self.policy is None and isinstance(message, (Snapshot, Decision)):
            self.counters["received_dropped"] += 1  # no policy here to apply them
        elif isinstance(message, Snapshot):
            self.counters["snapshots"] += 1
            self.last_seq = message.seq
            self._deliver(message)
        elif isinstance(message, Decision):
            self.counters["decisions"] += 1
            if message.seq <= self.last_seq:
                self.counters["duplicates"] += 1
                return
            if self.last_seq >= 0 and message.seq > self.last_seq + 1:
                self.counters["gaps"] += 1
                self._send(
                    sock,
                    ResyncRequest(adapter_id=self.adapter_id, last_seq=self.last_seq, reason="gap"),
                )
            self.last_seq = message.seq
            self._deliver(message)
        else:
            self.counters["unexpected"] += 1

    def _deliver(self, message: Decision | Snapshot) -> None:
        policy = self.policy
        if policy is not None:
            policy.inbox.append(message)

    # --- messages ---------------------------------------------------------------------------

    def hello(self) -> Hello:
        return Hello(
            adapter_id=self.adapter_id,
            engine_id=self.engine_id,
            last_seq=self.last_seq,
            started_at=self.started_at,
            policy=self.policy.core_name if self.policy is not None else "",
        )

    def report(self, *, force: bool = False) -> ResidencyReport | None:
        """The next report (counter deltas), or ``None`` when nothing changed and not forced
        (or there is no policy to report on)."""
        policy = self.policy
        if policy is None:
            return None
        now = dict(policy.stats)
        fields = residency_delta(now, self._reported)
        changed = any(fields[name] for name in _COUNTER_FIELDS) or fields["evicted_blocks"]
        if not changed and not force and not policy.resumes.outcomes:
            return None
        fields["resumes"] = policy.resumes.drain()
        self._reported = now
        self._report_seq += 1
        tier = policy.tier
        return ResidencyReport(
            adapter_id=self.adapter_id,
            report_seq=self._report_seq,
            at=self._wall(),
            policy=policy.core_name,
            resident_bytes={"cpu": tier.used * self.bytes_per_block},
            sessions_tracked=len(tier.session_resident),
            last_applied_seq=policy.last_applied_seq,
            **fields,  # type: ignore[arg-type]
        )


#: Where an engine's connection is kept on vLLM's offloading spec (one spec per engine's
#: scheduler; Tenure's manager and the SSD tier are both built from it).
_SPEC_ATTR = "_tenure_push_client"


def engine_push_client(
    spec: Any, addr: str, policy: TenureCachePolicy | None = None, **options: Any
) -> PushClient:
    """The engine's one push connection to ``addr``, started: made on the first call and kept
    on ``spec`` (vLLM's offloading spec of this engine), so every caller in the engine shares
    it. ``policy`` (Tenure's manager's) receives the decisions; ``options`` are
    :class:`PushClient`'s, used by the call that makes it. The SSD tier adds its reports with
    :meth:`PushClient.report_placement`."""
    client: PushClient | None = getattr(spec, _SPEC_ATTR, None)
    if client is None:
        client = PushClient(addr, policy, **options)
        setattr(spec, _SPEC_ATTR, client)
        client.start()
        return client
    if client.addr != addr:
        raise ValueError(
            f"this engine's push connection goes to {client.addr}; a second address "
            f"({addr}) would open another connection"
        )
    if policy is not None:
        if client.policy is not None and client.policy is not policy:
            raise ValueError("this engine's push connection serves another policy already")
        client.policy = policy
    return client
