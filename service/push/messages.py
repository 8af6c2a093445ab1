"""Typed messages of the push channel between the sidecar and engine adapters.

This module is the protocol's single definition; the sidecar (``service.push``) and the engine
adapter (``engine_adapter``) both import it, and it imports nothing from either side.

Protocol (version :data:`PROTOCOL_VERSION`)
-------------------------------------------
Transport: ZeroMQ. The sidecar binds one ``ROUTER`` socket (``ipc://`` path or loopback
``tcp://127.0.0.1:PORT``); each adapter connects one ``DEALER`` socket. Frames are msgpack
encodings of the tagged union :data:`Message` (``msgspec`` tagged structs, field ``kind``).

Adapter -> sidecar:
  * :class:`Hello` when the adapter starts, and again whenever it has heard nothing for
    ``hello_interval_s`` (this is also how it notices a restarted sidecar); it carries the last
    sequence number the adapter applied.
  * :class:`ResyncRequest` when the adapter sees a gap in sequence numbers.
  * :class:`ResidencyReport` periodically: counter *deltas* since the previous report, plus
    current gauges. Reports carry their own per-adapter sequence so the sidecar can drop
    duplicates.

Sidecar -> adapter:
  * :class:`Snapshot` in reply to every ``Hello`` / ``ResyncRequest``, and to every adapter
    periodically: the full decision table plus the tier configuration. Applying a snapshot
    replaces the adapter's table; it carries the sequence number of the newest decision it
    includes.
  * :class:`Decision` for every session-level decision, in sequence order. Decisions are
    idempotent (the newest per session wins), so a duplicated one is harmless; an adapter that
    receives ``seq > last_seq + 1`` asks for a resync and keeps serving with what it has.

Times on the wire are Unix seconds (wall clock); the adapter converts them to its own
monotonic clock on receipt. The engine never waits on this channel.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = [
    "PROTOCOL_VERSION",
    "Decision",
    "Hello",
    "Message",
    "ResidencyReport",
    "ResyncRequest",
    "Snapshot",
    "TierConfig",
    "decode",
    "encode",
]

PROTOCOL_VERSION = 1

#: Lifecycle state of a session as the sidecar sees it.
SessionState = Literal["active", "idle", "suspended", "finished"]


class Decision(msgspec.Struct, tag="decision", kw_only=True, frozen=True):
    """The sidecar's current decision for one session (the newest per session wins)."""

    seq: int
    #: Tenant-scoped session id, exactly as put into ``kv_transfer_params.tenure.session_id``.
    session_id: str
    state: SessionState
    turn: int = 0
    #: Predicted idle time before the next turn, seconds; ``None`` when unknown.
    expected_gap_s: float | None = None
    #: Absolute predicted wake-up (Unix seconds); ``None`` when unknown.
    wakeup_at: float | None = None
    last_turn: bool = False
    #: Suspended sessions: discard the host copy this many seconds after ``issued_at``
    #: (``None`` = retain on host indefinitely).
    host_ttl_s: float | None = None
    parent: str | None = None
    reason: str = ""
    issued_at: float = 0.0


class TierConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Runtime configuration pushed to adapters (set by SREs through ``/admin/config``)."""

    policy_mode: str = "tenure"
    #: Host-tier capacity the gate enforces, bytes; ``None`` = the engine's configured size.
    host_capacity_bytes: int | None = None
    #: Slack after the expected wake-up before a session counts as overdue, seconds.
    overdue_slack_s: float = 30.0


class Snapshot(msgspec.Struct, tag="snapshot", kw_only=True, frozen=True):
    seq: int
    decisions: list[Decision]
    config: TierConfig
    issued_at: float = 0.0
    protocol: int = PROTOCOL_VERSION


class Hello(msgspec.Struct, tag="hello", kw_only=True, frozen=True):
    adapter_id: str
    engine_id: str = ""
    last_seq: int = -1
    started_at: float = 0.0
    policy: str = ""
    protocol: int = PROTOCOL_VERSION


class ResyncRequest(msgspec.Struct, tag="resync", kw_only=True, frozen=True):
    adapter_id: str
    last_seq: int
    reason: str = "gap"


class ResidencyReport(msgspec.Struct, tag="residency", kw_only=True, frozen=True):
    """Counter deltas since the adapter's previous report, and current gauges."""

    adapter_id: str
    report_seq: int
    at: float
    policy: str = ""
    stores: int = 0
    stored_blocks: int = 0
    refusals: int = 0
    refused_blocks: int = 0
    #: Evicted blocks by eviction class (``service.policy.types.EvictionClass`` values).
    evicted_blocks: dict[str, int] = msgspec.field(default_factory=dict)
    host_hit_blocks: int = 0
    loads: int = 0
    bytes_stored: int = 0
    bytes_loaded: int = 0
    ttl_expiries: int = 0
    #: Sessions that arrived here with earlier turns this engine never saw (moved to it).
    cold_sessions: int = 0
    #: Gauges: resident bytes per tier name (e.g. ``{"cpu": 123}``) and live sessions known.
    resident_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    sessions_tracked: int = 0
    last_applied_seq: int = -1


Message = Decision | Snapshot | Hello | ResyncRequest | ResidencyReport

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(frame: bytes) -> Message:
    """Decode one frame; raises ``msgspec.DecodeError`` / ``ValidationError`` on bad input."""
    return _decoder.decode(frame)
