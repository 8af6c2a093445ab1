"""Typed messages of the push channel between the sidecar and engine adapters.

This module is the protocol's single definition; the sidecar (``tenure.service.push``) and the
engine adapter (``engine_adapter``) both import it, and it imports nothing from either side.

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
  * :class:`PlacementReport` periodically from a ``tenure-fs`` SSD tier (on its engine's one
    connection, :mod:`tenure.engine_adapter.placement_push`): bytes written per tier and segment
    class, bytes kept off the SSD and deleted per class (deltas), SSD bytes and files in use,
    the write rate and the projected device-years (gauges). Bounded: one counter per tier and
    class, never per session; its own ``report_seq`` drops duplicates the same way. A sidecar that
    predates it counts the frame as undecodable and carries on.

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

from tenure.service.policy.segments import SegmentClass

__all__ = [
    "PLACEMENT_CLASSES",
    "PLACEMENT_TIERS",
    "PROTOCOL_VERSION",
    "Decision",
    "Hello",
    "Message",
    "PlacementReport",
    "ResidencyReport",
    "ResumeOutcome",
    "ResyncRequest",
    "RetentionState",
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
    #: Suspended sessions on the ttl branch: discard the host copy when the tenant's rent
    #: clock (:class:`RetentionState`) reaches this (GPU-s). An adapter that knows the clock
    #: re-computes the timer from it on every snapshot; ``host_ttl_s`` is the same timer at
    #: the price when issued (what an adapter without the clock applies, as before).
    host_rent_limit: float | None = None
    #: The run probably ended with this turn (an inferred end, not a declared one): the
    #: session's blocks go first among the resident, but are not reclaimed.
    likely_end: bool = False


class RetentionState(msgspec.Struct, kw_only=True, frozen=True):
    """One tenant's host-retention branch as the online controller last chose it.

    Each suspension's own timer travels in its :class:`Decision`; this says which branch new
    suspensions get and since when (adapters log a change), and carries the tenant's rent
    clock (:class:`~tenure.service.policy.rent.RentClock`): ``R(t) = rent_accrued + rent_rate x (t
    - rent_at)``. A held copy whose decision has ``host_rent_limit`` expires when ``R``
    reaches it, so a new rate re-prices every held copy of the tenant. ``rent_at`` ``None``:
    no clock (a sidecar that predates it); adapters keep each decision's ``host_ttl_s``.
    """

    branch: str = "ttl"
    #: ``t2(lambda)`` a suspension gets now; ``None`` = retained until resume.
    host_ttl_s: float | None = None
    lambda_per_s: float = 0.0
    decided_at: float = 0.0
    #: Rent accrued by one host slot at ``rent_at`` (GPU-s), ``rent_at`` in Unix seconds, and
    #: the rate charged since (``alpha2`` at the lambda in use, GPU-s per held second).
    rent_accrued: float = 0.0
    rent_at: float | None = None
    rent_rate: float = 0.0


class TierConfig(msgspec.Struct, kw_only=True, frozen=True):
    """Runtime configuration pushed to adapters (set by SREs through ``/admin/config``)."""

    policy_mode: str = "tenure"
    #: Host-tier capacity the gate enforces, bytes; ``None`` = the engine's configured size.
    host_capacity_bytes: int | None = None
    #: Slack after the expected wake-up before a session counts as overdue, seconds.
    overdue_slack_s: float = 30.0
    #: Tenant -> its current host-retention branch (the online controller's).
    retention: dict[str, RetentionState] = msgspec.field(default_factory=dict)


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


class ResumeOutcome(msgspec.Struct, kw_only=True, frozen=True):
    """Where the first request after a suspension found its prompt's KV (adapter's view).

    Token counts are in full offload blocks of the prompt: ``hbm_tokens`` were already in
    the GPU prefix cache (vLLM looked up only past them), ``host_tokens`` were loaded from the
    host tier, ``computed_tokens`` the rest. ``outcome`` is the source of most of them.
    """

    #: Tenant part of the scoped session id (the sidecar keeps only configured tenants).
    tenant: str
    #: ``ttl`` when the suspension was given a host timer, else ``retain``.
    branch: str
    outcome: str
    wait_s: float = 0.0
    #: Seconds the host copy was held for this suspension (the wait, or the timer if shorter).
    host_held_s: float = 0.0
    prompt_tokens: int = 0
    hbm_tokens: int = 0
    host_tokens: int = 0
    computed_tokens: int = 0


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
    #: Evicted blocks by eviction class (``tenure.service.policy.types.EvictionClass`` values).
    evicted_blocks: dict[str, int] = msgspec.field(default_factory=dict)
    host_hit_blocks: int = 0
    loads: int = 0
    bytes_stored: int = 0
    bytes_loaded: int = 0
    ttl_expiries: int = 0
    #: Held host copies re-timed because their tenant's rent rate moved (re-priced timers).
    ttl_repriced: int = 0
    #: Sessions that arrived here with earlier turns this engine never saw (moved to it).
    cold_sessions: int = 0
    #: Gauges: resident bytes per tier name (e.g. ``{"cpu": 123}``) and live sessions known.
    resident_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    sessions_tracked: int = 0
    last_applied_seq: int = -1
    #: Resumed requests classified since the previous report (at most 256 per report).
    resumes: list[ResumeOutcome] = msgspec.field(default_factory=list)


#: The tiers and segment classes a :class:`PlacementReport` may name (``untagged``: blocks of
#: requests that carried no segments); the sidecar folds anything else into one ``other``.
PLACEMENT_TIERS = ("dram", "ssd")
PLACEMENT_CLASSES = (*(c.value for c in SegmentClass), "untagged")


class PlacementReport(msgspec.Struct, tag="placement", kw_only=True, frozen=True):
    """A ``tenure-fs`` SSD tier's placement accounting since its previous report.

    Counters are deltas (bytes); gauges are current values. Byte counts on the SSD side are
    what really hit the filesystem (file sizes), as the tier's own vLLM metrics count them.
    """

    adapter_id: str
    report_seq: int
    at: float
    #: The placement policy the tier enforces (``lachesis-wt``, ``write-through``).
    placement: str = ""
    #: Tier (``dram``, ``ssd``) -> segment class -> bytes written since the last report.
    write_bytes: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    #: Segment class -> bytes stored in DRAM that placement kept off the SSD tier.
    kept_off_ssd_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    #: Segment class -> SSD bytes deleted because their segment closed.
    deleted_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    deleted_files: int = 0
    #: Gauges: bytes and files of KV the tier wrote and has not deleted.
    ssd_used_bytes: int = 0
    ssd_files: int = 0
    #: Configured SSD capacity (0: not configured) and warranty (0: not configured).
    ssd_capacity_bytes: int = 0
    ssd_warranty_years: float = 0.0
    ssd_write_rate_bytes_per_s: float = 0.0
    #: Projected SSD lifetime at the current write rate, 24x7; ``None`` when endurance is not
    #: configured or nothing was written yet.
    projected_device_years: float | None = None


Message = Decision | Snapshot | Hello | ResyncRequest | ResidencyReport | PlacementReport

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def decode(frame: bytes) -> Message:
    """Decode one frame; raises ``msgspec.DecodeError`` / ``ValidationError`` on bad input."""
    return _decoder.decode(frame)
