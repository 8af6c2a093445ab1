"""The sidecar side of the push channel: a ZeroMQ ROUTER that adapters' DEALERs connect to.

The protocol is documented in :mod:`tenure.service.wire.push`. This side:

* tails the decision stream in Redis and forwards every decision, in sequence order, to every
  adapter heard from recently. The stream is written by every replica, so an adapter connected
  to any replica sees all decisions with one contiguous sequence: replicas behave as one;
* answers each ``Hello`` and ``ResyncRequest`` with a full :class:`Snapshot` (the decision table
  in Redis plus the tier configuration), and sends every adapter a snapshot periodically;
* feeds inbound :class:`ResidencyReport` deltas to the metrics, dropping duplicates by
  ``(adapter_id, report_seq)``, and their resume outcomes to ``on_resumes`` (the retention
  controller prices them); :class:`PlacementReport` deltas (a ``tenure-fs`` SSD
  tier's bytes per tier and segment class, deletions, SSD use and wear) the same way.

Redis or adapter failures never propagate: the loops log, count, back off and carry on.

Threat model (the measures are in :mod:`tenure.service.push.security`). Whoever can connect to the
ROUTER receives every decision of every tenant (tenant-scoped session ids, their states and
wake-ups) and can send residency reports that feed ``/metrics``; whoever can pose as the
sidecar to an adapter can push ``finished`` decisions that reclaim any session's host KV. So:

* ``tcp://`` on a loopback address is open to every local process, ``ipc://PATH`` to who may
  open the socket file: it is created with ``ipc_mode`` permissions (default 0600, the
  sidecar's user only; the umask is narrowed around the bind so there is no window);
* CURVE (``curve_secret_key``): the channel is encrypted and adapters check the sidecar's
  public key (nobody else can pose as it); with ``client_keys`` only the listed adapter keys
  may connect (ZAP), and each adapter's label in metrics is the name its key was given;
* nothing a peer sends is trusted as a label: without CURVE names, adapter ids, tier and
  eviction-class names are bounded (``tenure.service.metrics.LabelBudget``); peers are capped at
  ``max_adapters``; snapshots per peer are rate-limited (each is the whole decision table);
  frames over 1 MiB drop the connection.

A non-loopback ``tcp://`` address without CURVE is refused by the settings unless explicitly
allowed (``TENURE_PUSH_INSECURE``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

from tenure.service.metrics import OTHER, Metrics
from tenure.service.push.security import PushSecurity, bind_ipc, secure_socket
from tenure.service.state.breaker import StateUnavailable
from tenure.service.state.store import StateStore
from tenure.service.wire.push import (
    Decision,
    Hello,
    Message,
    PlacementReport,
    ResidencyReport,
    ResumeOutcome,
    ResyncRequest,
    Snapshot,
    TierConfig,
    decode,
    encode,
)

__all__ = ["MAX_RESUMES_PER_REPORT", "PushServer"]

log = logging.getLogger(__name__)

#: Resume outcomes taken from one report (an adapter drains at most what one interval saw).
MAX_RESUMES_PER_REPORT = 256

#: An adapter silent for this many snapshot intervals is forgotten (it re-announces itself).
_FORGET_AFTER_INTERVALS = 3
_TAIL_BLOCK_MS = 1000
#: After a read that found decisions, wait this long before the next one, so that under
#: load one read carries many decisions (each read wakes Redis and the sidecar: at one
#: decision per proxied request that was a wake-up pair per request). A lone decision still
#: goes out at once; the next ones wait at most this long.
_TAIL_COALESCE_S = 0.01
#: Largest frame a peer may send (reports are a few hundred bytes).
_MAX_FRAME_BYTES = 1 << 20
#: Snapshots per peer: a burst of this many, then one per second.
_SNAPSHOT_BURST = 4.0
#: Largest magnitude a report's number may have: what a float (a Prometheus value) holds
#: exactly, far above any real per-interval delta or gauge.
_MAX_REPORT_VALUE = 2**53
#: Largest per-report session move count: it is summed in Redis (``HINCRBY``, signed 64-bit),
#: so a bound here keeps the sum from overflowing for 2**31 reports.
_MAX_REPORT_MOVES = 2**32


def _report_in_range(report: ResidencyReport) -> bool:
    """Whether every number of ``report`` is one the metrics and Redis can take. The wire
    format's integers are unbounded (msgpack carries up to 2**64 - 1), and an adapter's
    ``cold_sessions = 2**63`` overflowed ``HINCRBY`` with a traceback per report."""
    numbers: list[int | float] = [
        report.report_seq, report.at, report.stores, report.stored_blocks, report.refusals,
        report.refused_blocks, report.host_hit_blocks, report.loads, report.bytes_stored,
        report.bytes_loaded, report.ttl_expiries, report.ttl_repriced, report.sessions_tracked,
        report.last_applied_seq, *report.evicted_blocks.values(),
        *report.resident_bytes.values(),
    ]  # fmt: skip
    for resume in report.resumes:
        numbers += [resume.wait_s, resume.host_held_s, resume.prompt_tokens, resume.hbm_tokens,
                    resume.host_tokens, resume.computed_tokens]  # fmt: skip
    if not abs(report.cold_sessions) <= _MAX_REPORT_MOVES:
        return False
    # ``not abs(x) <= bound`` is also true of NaN.
    return not any(not abs(x) <= _MAX_REPORT_VALUE for x in numbers)


@dataclass(slots=True)
class _Peer:
    identity: bytes
    adapter_id: str
    last_heard: float
    last_report_seq: int = -1
    last_placement_seq: int = -1
    last_applied_seq: int = -1
    snapshot_tokens: float = _SNAPSHOT_BURST
    tokens_at: float = 0.0

    def may_snapshot(self, now: float) -> bool:
        self.snapshot_tokens = min(_SNAPSHOT_BURST, self.snapshot_tokens + (now - self.tokens_at))
        self.tokens_at = now
        if self.snapshot_tokens < 1.0:
            return False
        self.snapshot_tokens -= 1.0
        return True


class PushServer:
    def __init__(
        self,
        addr: str,
        store: StateStore,
        metrics: Metrics,
        *,
        tier_config: Callable[[], TierConfig],
        snapshot_interval_s: float,
        clock: Callable[[], float] = time.time,
        security: PushSecurity | None = None,
        on_resumes: Callable[[Sequence[ResumeOutcome]], None] | None = None,
    ) -> None:
        self.addr = addr
        #: Where a report's resume outcomes go (the retention controller's pricing).
        self.on_resumes = on_resumes
        self.security = security or PushSecurity()
        self._auth: AsyncioAuthenticator | None = None
        self.store = store
        self.metrics = metrics
        self.tier_config = tier_config
        self.snapshot_interval_s = snapshot_interval_s
        self.clock = clock
        self.bound_addr = ""
        self.last_sent_seq = 0
        self._forwarded_seq = 0
        self._ctx = zmq.asyncio.Context()
        self._socket: zmq.asyncio.Socket | None = None
        self._peers: dict[bytes, _Peer] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._send_lock = asyncio.Lock()
        self._stopping = False

    @property
    def adapters(self) -> list[str]:
        return sorted(peer.adapter_id for peer in self._peers.values())

    async def start(self) -> None:
        socket = self._ctx.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        # Drop messages for a vanished peer instead of blocking: the engine never waits on us,
        # and we never wait on it either.
        socket.setsockopt(zmq.ROUTER_MANDATORY, 0)
        socket.setsockopt(zmq.SNDHWM, 10_000)
        socket.setsockopt(zmq.MAXMSGSIZE, _MAX_FRAME_BYTES)
        self._secure(socket)
        if self.addr.startswith("tcp://") and self.addr.endswith(":0"):
            port = socket.bind_to_random_port(self.addr.rsplit(":", 1)[0])
            self.bound_addr = f"{self.addr.rsplit(':', 1)[0]}:{port}"
        elif self.addr.startswith("ipc://") and not self.addr.startswith("ipc://@"):
            bind_ipc(socket, self.addr.removeprefix("ipc://"), self.security.ipc_mode)
            self.bound_addr = self.addr
        else:
            socket.bind(self.addr)
            self.bound_addr = self.addr
        self._socket = socket
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._receive_loop(), name="push-receive"),
            loop.create_task(self._tail_loop(), name="push-tail"),
            loop.create_task(self._snapshot_loop(), name="push-snapshots"),
        ]

    def _secure(self, socket: zmq.asyncio.Socket) -> None:
        self._auth = secure_socket(socket, self.security, self._ctx)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            # Bounded: a cancel swallowed inside a Redis client timeout block must not hang
            # shutdown; the loops also check ``_stopping`` on every turn.
            await asyncio.wait(self._tasks, timeout=2.0)
        self._tasks = []
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._ctx.term()

    # --- outbound ----------------------------------------------------------------------------

    async def _send(self, identity: bytes, message: Message, kind: str) -> None:
        if self._socket is None:
            return
        async with self._send_lock:
            try:
                await self._socket.send_multipart([identity, encode(message)], flags=zmq.NOBLOCK)
            except zmq.Again:
                return  # the peer's queue is full: it will see the gap and resync
            except zmq.ZMQError as exc:
                log.debug("push send failed: %s", exc)
                return
        self.metrics.push_messages.labels("out", kind).inc()

    async def snapshot(self) -> Snapshot:
        seq, table = await self.store.decision_table()
        return Snapshot(seq=seq, decisions=table, config=self.tier_config(), issued_at=self.clock())

    async def send_snapshot(self, identity: bytes) -> None:
        try:
            snap = await self.snapshot()
        except StateUnavailable:
            return  # the adapter keeps serving with what it has and asks again later
        await self._send(identity, snap, "snapshot")
        self.last_sent_seq = max(self.last_sent_seq, snap.seq)

    async def broadcast_snapshot(self) -> None:
        """Send every known adapter a fresh snapshot (after a config change, periodically)."""
        self._forget_silent()
        if not self._peers:
            return
        try:
            snap = await self.snapshot()
        except StateUnavailable:
            return
        for identity in list(self._peers):
            await self._send(identity, snap, "snapshot")

    async def _broadcast_decision(self, decision: Decision) -> None:
        self.metrics.push_lag.observe(max(0.0, self.clock() - decision.issued_at))
        self.last_sent_seq = max(self.last_sent_seq, decision.seq)
        for identity in list(self._peers):
            await self._send(identity, decision, "decision")

    # --- loops -------------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        assert self._socket is not None
        while not self._stopping:
            try:
                frames = await self._socket.recv_multipart(copy=False)
            except zmq.ZMQError as exc:
                log.warning("push receive failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if len(frames) != 2:
                self.metrics.push_bad_frames.inc()
                continue
            identity, frame = frames[0].bytes, frames[1]
            try:
                message = decode(frame.bytes)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.metrics.push_bad_frames.inc()
                continue
            try:
                await self._handle(identity, message, self._authenticated(frame))
            except Exception:  # one bad peer must not stop the channel
                log.exception("push message handling failed")

    def _authenticated(self, frame: Any) -> str | None:
        """The name the sender's CURVE key was given (ZAP), or None without an allow-list."""
        if self._auth is None:
            return None
        with contextlib.suppress(zmq.ZMQError, KeyError):
            return str(frame.get("User-Id"))
        return None

    async def _handle(self, identity: bytes, message: Message, name: str | None = None) -> None:
        """One inbound message; ``name`` is the sender's authenticated name, if any. Without
        one, a peer is labelled by the id it sent first (through the metrics' bounded label
        budget), and a later message claiming another id changes nothing."""
        now = self.clock()
        claimed = getattr(message, "adapter_id", "")
        label = name or (claimed if isinstance(claimed, str) else "")
        if isinstance(message, Hello):
            self.metrics.push_messages.labels("in", "hello").inc()
            peer = self._touch(identity, label, now)
            if peer is None:
                return
            peer.last_applied_seq = message.last_seq
            if peer.may_snapshot(now):
                await self.send_snapshot(identity)
        elif isinstance(message, ResyncRequest):
            self.metrics.push_messages.labels("in", "resync").inc()
            peer = self._touch(identity, label, now)
            if peer is None:
                return
            self.metrics.push_resyncs.inc()
            if peer.may_snapshot(now):
                await self.send_snapshot(identity)
        elif isinstance(message, ResidencyReport):
            self.metrics.push_messages.labels("in", "residency").inc()
            peer = self._touch(identity, label, now)
            if peer is None:
                return
            if not _report_in_range(message):
                self.metrics.push_bad_frames.inc()
                return
            if message.report_seq <= peer.last_report_seq:
                return  # a duplicate (or a replay): its deltas were counted already
            peer.last_report_seq = message.report_seq
            peer.last_applied_seq = message.last_applied_seq
            self.metrics.record_counters(message)
            if message.resumes and self.on_resumes is not None:
                self.on_resumes(message.resumes[:MAX_RESUMES_PER_REPORT])
            self.metrics.record_gauges(message, peer.adapter_id)
            self.metrics.count_moves(peer.adapter_id, message.cold_sessions)
            await self._record_engine(peer.adapter_id, message, now)
            behind = max(0, self.last_sent_seq - message.last_applied_seq)
            self.metrics.push_seq_behind.labels(peer.adapter_id).set(behind)
        elif isinstance(message, PlacementReport):
            self.metrics.push_messages.labels("in", "placement").inc()
            peer = self._touch(identity, label, now)
            if peer is None:
                return
            if message.report_seq <= peer.last_placement_seq:
                return  # a duplicate (or a replay): its deltas were counted already
            peer.last_placement_seq = message.report_seq
            self.metrics.record_placement(message, peer.adapter_id)
        else:
            self.metrics.push_bad_frames.inc()  # adapters never send decisions or snapshots

    async def _record_engine(self, engine: str, report: ResidencyReport, now: float) -> None:
        """Per-engine residency in Redis, so ``/admin/engines`` on any replica shows them all."""
        summary = {
            "resident_bytes": report.resident_bytes,
            "sessions_tracked": report.sessions_tracked,
            "last_applied_seq": report.last_applied_seq,
            "policy": report.policy[:32],
            "reported_at": now,
        }
        # Redis down: the metrics still count this report; the summary comes with the next.
        with contextlib.suppress(StateUnavailable):
            await self.store.record_engine(engine, summary, report.cold_sessions)

    def _touch(self, identity: bytes, label: str, now: float) -> _Peer | None:
        """The peer, adopted if new (a report from an adapter we forgot, or from before our
        restart); None when ``max_adapters`` peers are tracked already."""
        peer = self._peers.get(identity)
        if peer is None:
            if len(self._peers) >= self.security.max_adapters:
                self._forget_silent()
            if len(self._peers) >= self.security.max_adapters:
                self.metrics.push_refused_peers.inc()
                return None
            if self._auth is not None:
                adapter = label  # the name its key was registered under
            elif self.security.engine_ids:
                adapter = label if label in self.security.engine_ids else OTHER
            else:
                adapter = self.metrics.adapter_label(label)
            peer = self._peers[identity] = _Peer(identity, adapter, now, tokens_at=now)
            self.metrics.push_adapters.set(len(self._peers))
        peer.last_heard = now
        return peer

    def _forget_silent(self) -> None:
        horizon = self.clock() - _FORGET_AFTER_INTERVALS * self.snapshot_interval_s
        for identity, peer in list(self._peers.items()):
            if peer.last_heard < horizon:
                del self._peers[identity]
        self.metrics.push_adapters.set(len(self._peers))

    async def _tail_loop(self) -> None:
        last_id: str | None = None
        backoff = 0.05
        while not self._stopping:
            try:
                if last_id is None:
                    last_id = await self.store.last_decision_id()
                entries = await self.store.read_decisions(last_id, block_ms=_TAIL_BLOCK_MS)
                backoff = 0.05
            except StateUnavailable as exc:
                await asyncio.sleep(max(backoff, exc.retry_after_s))
                backoff = min(backoff * 2, 5.0)
                # Redis may come back empty (no persistence): restart from its current tail
                # and let the periodic snapshot bring adapters back in line.
                last_id = None
                continue
            for entry_id, decision in entries:
                last_id = entry_id
                if decision.seq <= self._forwarded_seq:
                    # The stream's sequence went backwards: Redis lost its data (a restart
                    # without persistence). Adapters would take the new numbers for stale
                    # duplicates, so hand them a snapshot carrying the new sequence first.
                    self.last_sent_seq = 0
                    await self.broadcast_snapshot()
                self._forwarded_seq = decision.seq
                await self._broadcast_decision(decision)
            if entries:
                await asyncio.sleep(_TAIL_COALESCE_S)

    async def _snapshot_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.snapshot_interval_s)
            try:
                await self.broadcast_snapshot()
            except Exception:
                log.exception("periodic snapshot failed")
