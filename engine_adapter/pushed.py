"""Pushed decisions and timers: what the sidecar decided and the core's due work, applied.

The push-channel thread only appends to ``inbox``; :meth:`Pushed.poll` applies it on
the engine thread once per step. Decision times are Unix seconds on the wire: converted here
with the wall clock the policy was given (never read inside the core). Blocks the core drops
outside a store (reclaim, TTL) go to :meth:`~tenure.engine_adapter.holdings.Holdings.drop_victims`.

Re-priced host timers (:mod:`tenure.engine_adapter.rent_timers`): a suspension whose decision
carries ``host_rent_limit`` expires when its tenant's rent clock reaches the limit; every snapshot
brings the clocks, and a held copy whose timer moved by more than max(1 s, 1%) is re-hinted
(stat ``ttl_repriced``). Without a clock for the tenant (an older sidecar) the decision's own
``host_ttl_s`` applies, as before.
"""

from __future__ import annotations

import logging
import math
from collections import Counter, deque
from collections.abc import Callable

from tenure.engine_adapter.holdings import Holdings
from tenure.engine_adapter.rent_timers import Held, RentTimers, moved, tenant_of, valid_limit
from tenure.engine_adapter.resumes import ResumeTracker
from tenure.engine_adapter.sessions import Sessions
from tenure.service.policy import SessionHint, TierPolicy
from tenure.service.policy.lifecycle import STOP_BLIND
from tenure.service.wire.push import Decision, Snapshot

__all__ = ["Pushed"]

log = logging.getLogger("vllm.tenure")

#: Per-session tables above this size drop sessions with nothing resident (checked every
#: 1024 polls, i.e. engine steps).
_PRUNE_ABOVE = 20_000


class Pushed:
    """Reclaim, TTL expiry and the sidecar's decisions, applied on the engine thread."""

    def __init__(
        self,
        *,
        core: TierPolicy,
        holdings: Holdings,
        sessions: Sessions,
        stats: Counter[str],
        inbox: deque[Decision | Snapshot],
        resumes: ResumeTracker,
        rent_timers: RentTimers,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        retention_branches: dict[str, str],
    ) -> None:
        self.core = core
        self.tier = holdings.tier
        self.holdings = holdings
        self.sessions = sessions
        self.stats = stats
        #: Push channel -> engine thread: Decisions and Snapshots (appended by another thread).
        self.inbox = inbox
        self.resumes = resumes
        self.rent_timers = rent_timers
        self.clock = clock
        self.wall_clock = wall_clock
        #: Tenant -> the host-retention branch of the sidecar's last snapshot.
        self.retention_branches = retention_branches
        #: Session -> the newest decision sequence number applied.
        self.applied_seq: dict[str, int] = {}
        self.last_applied_seq = -1
        self._polls = 0
        self._next_due = math.inf

    def refresh_timer(self) -> None:
        timer = self.core.next_timer()
        self._next_due = math.inf if timer is None else timer

    def pending_timer(self) -> float:
        """When the core next has due work (monotonic seconds; ``inf`` = none)."""
        return self._next_due

    def has_work(self, now: float) -> bool:
        return bool(self.inbox) or now >= self._next_due or bool(self.holdings.released)

    def poll(self, now: float | None = None) -> None:
        """Apply pushed decisions and fire due timers (engine thread, once per step)."""
        now = self.clock() if now is None else now
        inbox = self.inbox
        while inbox:
            message = inbox.popleft()
            if isinstance(message, Snapshot):
                self.stats["snapshots_applied"] += 1
                self._note_retention(message)
                if message.seq < self.last_applied_seq:
                    # The sidecar's sequence restarted (its state was lost): its snapshot is
                    # the new baseline, whatever numbers we applied before.
                    self.applied_seq.clear()
                # The clocks first: a decision this snapshot brings is timed by them.
                refused = self.rent_timers.update(message.config.retention, message.issued_at)
                if refused:
                    self.stats["rent_bad_fields"] += refused
                for decision in message.decisions:
                    self._apply(decision, now)
                self.last_applied_seq = message.seq
                self._reprice(now)
            else:
                self._apply(message, now)
                self.last_applied_seq = max(self.last_applied_seq, message.seq)
        self._polls += 1
        if self._polls % 1024 == 0:
            self._prune()
        if now >= self._next_due:
            before = self.core.counters["ttl_expiries"]
            self.holdings.drop_victims(self.tier.expire(now), now)
            self.stats["ttl_expiries"] += self.core.counters["ttl_expiries"] - before
            self.refresh_timer()

    def _note_retention(self, snapshot: Snapshot) -> None:
        """Log a tenant's host-retention branch when the sidecar's controller changes it (each
        suspension's own timer arrives in its decision; this is for the engine's operators)."""
        branches = {t: r.branch for t, r in snapshot.config.retention.items()}
        for tenant, branch in branches.items():
            before = self.retention_branches.get(tenant)
            if before is not None and before != branch:
                self.stats["retention_branch_changes"] += 1
                log.info("tenure: host-retention branch of %s: %s -> %s", tenant, before, branch)
        if len(branches) <= 1024:
            self.retention_branches = branches

    def _prune(self) -> None:
        """Forget per-session bookkeeping of sessions with nothing resident (bounded memory)."""
        resident = self.tier.session_resident
        held = self.rent_timers.held
        for session in [s for s in held if s not in resident or s not in self.resumes]:
            del held[session]
        sessions = self.sessions
        for table in (self.applied_seq, sessions.last_hint):
            if len(table) > _PRUNE_ABOVE:
                for session in [s for s in table if s not in resident]:
                    del table[session]
        if len(sessions.held) > _PRUNE_ABOVE:
            sessions.held = {s for s in sessions.held if s in resident or s in sessions.last_hint}
        if len(sessions.ended) > _PRUNE_ABOVE:
            sessions.ended = {s for s in sessions.ended if s in resident}
        holdings = self.holdings
        if len(holdings.sharers) > _PRUNE_ABOVE:
            loc = holdings.keys.loc
            holdings.sharers = {k: v for k, v in holdings.sharers.items() if k in loc}

    def _apply(self, decision: Decision, now: float) -> None:
        session = decision.session_id
        if decision.seq <= self.applied_seq.get(session, -1):
            return  # duplicate or older than what we applied (newest per session wins)
        self.applied_seq[session] = decision.seq
        sessions = self.sessions
        if session not in sessions.held and session not in self.tier.session_resident:
            # Another engine's session (the push channel fans out to all adapters): nothing
            # of it is here, and its next request here carries its tags itself.
            self.stats["decisions_applied"] += 1
            self.stats["decisions_foreign"] += 1
            return
        wall = self.wall_clock()  # wire times are Unix seconds
        ttl: float | None = None
        if decision.host_ttl_s is not None:
            issued = decision.issued_at or wall
            ttl = max(0.0, issued + decision.host_ttl_s - wall)
        limit = decision.host_rent_limit if decision.state == "suspended" else None
        if limit is not None and not valid_limit(limit):
            self.stats["rent_bad_fields"] += 1
            limit = None
        if limit is not None:
            # The tenant's clock, if a snapshot as new as this decision brought one (else the
            # decision's own timer is the newer price; the next snapshot re-prices it).
            known, repriced = self.rent_timers.remaining(
                tenant_of(session), limit, wall, newer_than=decision.issued_at
            )
            ttl = repriced if known else ttl
        hint = self._hint(decision, wall, ttl)
        if decision.state == "suspended":
            # The timer as issued (the tracker reports the branch and the time held).
            if limit is None:
                self.resumes.suspended(session, decision.issued_at, decision.host_ttl_s)
                self.rent_timers.release(session)
            else:
                since = decision.issued_at or wall
                held_s = None if ttl is None else max(0.0, wall + ttl - since)
                self.resumes.suspended(session, decision.issued_at, held_s, repriced=True)
                deadline = None if ttl is None else now + ttl
                self.rent_timers.hold(session, Held(tenant_of(session), limit, decision, deadline))
        else:
            self.rent_timers.release(session)
            if hint.last_turn:
                self.resumes.forget(session)
        last = hint.last_turn
        if last:
            sessions.ended.add(session)
            sessions.last_hint.pop(session, None)
        else:
            sessions.last_hint[session] = hint
        self.stats["decisions_applied"] += 1
        self._hint_core(session, hint, now)

    def _hint(self, decision: Decision, wall: float, ttl: float | None) -> SessionHint:
        """The core's hint for ``decision`` at ``wall`` with a host timer ``ttl`` from now."""
        gap = decision.expected_gap_s
        if decision.wakeup_at is not None:
            gap = max(0.0, decision.wakeup_at - wall)
        if decision.reason == STOP_BLIND and self.core.learns_gaps:
            # The sidecar saw no stop reason: its gap is one median for the whole tenant; the
            # core learns this session's own from the traffic it serves (gap_learner).
            gap = None
        return SessionHint(
            expected_gap_s=gap,
            last_turn=decision.last_turn or decision.state == "finished",
            suspended=decision.state == "suspended",
            parent=decision.parent,
            host_ttl_s=ttl,
            likely_end=decision.likely_end,
        )

    def _hint_core(self, session: str, hint: SessionHint, now: float) -> None:
        before = self.core.counters["ttl_expiries"]
        self.holdings.drop_victims(self.tier.hint(session, hint, now), now)
        self.stats["ttl_expiries"] += self.core.counters["ttl_expiries"] - before
        self.refresh_timer()

    def _reprice(self, now: float) -> None:
        """Re-time every held copy from its tenant's clock (after a snapshot brought them)."""
        wall = self.wall_clock()
        held = self.rent_timers.held
        for session, copy in list(held.items()):
            if session not in self.resumes or self.tier.session_resident.get(session, 0) <= 0:
                del held[session]  # resumed, or its copy is gone (expired, evicted)
                continue
            known, ttl = self.rent_timers.remaining(copy.tenant, copy.limit, wall)
            deadline = None if ttl is None else now + ttl
            if not known or not moved(copy.deadline, deadline, now):
                continue
            copy.deadline = deadline
            hint = self._hint(copy.decision, wall, ttl)
            self.sessions.last_hint[session] = hint
            self.resumes.retime(session, None if ttl is None else wall + ttl)
            self.stats["ttl_repriced"] += 1
            self._hint_core(session, hint, now)
