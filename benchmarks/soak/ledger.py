"""The soak's client-side ledger: every turn sent and every lifecycle write acknowledged.

A write is *acknowledged* when the sidecar answered 200 with the session's view (suspend,
resume, end): the ledger keeps the newest acknowledged (state, turn) per session and when it
was acknowledged. At the end each session's record in Redis is read back through the sidecar
and compared: a session whose record is missing or older than its newest acknowledged write
lost that write; it is *inside the window* when it was acknowledged less than ``window_s``
before a Redis master was killed (asynchronous replication's loss window), else it counts in
``acknowledged_writes_lost``. A *finished* session acknowledged more than the sidecar's
``finished_ttl_s`` before its record was read back has expired by design: it is counted as
``acknowledged_writes_expired``, never as lost (the read-back of a long run takes tens of
seconds, so each record's own read time is what counts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Ack", "Ledger", "TurnRecord"]


@dataclass(frozen=True, slots=True)
class TurnRecord:
    at: float  # seconds since the soak started
    session: str
    status: int  # HTTP status of the first attempt; 0 = no answer
    latency_s: float
    replica: int
    retried_ok: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    at: float
    state: str
    turn: int


@dataclass
class Ledger:
    turns: list[TurnRecord] = field(default_factory=list)
    acks: dict[str, Ack] = field(default_factory=dict)
    #: Lifecycle writes refused (503 while Redis failed over): retried by the driver.
    refused_writes: int = 0
    #: Sessions whose turns all went out (the driver's view).
    sessions_done: int = 0

    def ack(self, session: str, at: float, state: str, turn: int) -> None:
        self.acks[session] = Ack(at, state, turn)

    def check(
        self,
        records: dict[str, dict[str, object] | None],
        master_kills: list[float],
        window_s: float,
        *,
        read_at: float | Mapping[str, float] | None = None,
        finished_ttl_s: float | None = None,
    ) -> dict[str, object]:
        """Compare the ledger with the records read back (``None``: not found) at ``read_at``
        (seconds since the start; per session where the read-back took long enough for
        sessions to expire while it ran), with the sidecar's ``finished_ttl_s``."""
        expired: list[str] = []
        lost: list[str] = []
        lost_in_window: list[str] = []
        mismatched: list[str] = []
        for session, ack in self.acks.items():
            record = records.get(session)
            ok = (
                record is not None
                and int(str(record.get("turn", -1))) >= ack.turn
                and (
                    record.get("state") == ack.state or int(str(record.get("turn", -1))) > ack.turn
                )
            )
            if ok:
                continue
            read = read_at.get(session) if isinstance(read_at, Mapping) else read_at
            if (
                record is None
                and ack.state == "finished"
                and read is not None
                and finished_ttl_s is not None
                and read - ack.at > finished_ttl_s
            ):
                expired.append(session)
                continue
            in_window = any(0 <= kill - ack.at < window_s for kill in master_kills)
            (lost_in_window if in_window else lost).append(session)
            if not in_window:
                mismatched.append(session)
        return {
            "acknowledged_writes": len(self.acks),
            "acknowledged_writes_expired": len(expired),
            "acknowledged_writes_lost": len(lost),
            "acknowledged_writes_lost_in_window": len(lost_in_window),
            "ledger_mismatches": len(mismatched),
            "lost_sessions": sorted(lost)[:20],
        }
