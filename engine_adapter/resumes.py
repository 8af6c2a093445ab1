"""Classify the first request after a suspension by where its prompt's KV came from.

The sidecar's suspend decision reaches the adapter on the push channel; the session's next
request is the resume. For it the adapter counts, in full offload blocks of the prompt:

* ``hbm``: blocks the GPU prefix cache still held. vLLM looks up the host tier only past the
  blocks computed locally, so the first looked-up block's start is where the GPU hit ends (no
  lookup at all: the GPU held every full block);
* ``host``: blocks loaded from the host tier for this request (``prepare_load``);
* ``computed``: the rest, computed again.

The outcome is the source of most of them (ties: hbm, then host). Outcomes wait in a bounded
queue the push thread drains into its next residency report. Engine thread only, except
:meth:`ResumeTracker.drain` (a deque's pops are thread-safe).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from vllm.v1.kv_offload.base import ReqContext

from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.wire.push import ResumeOutcome

__all__ = ["ResumeTracker"]

#: Suspended sessions remembered (the oldest are forgotten past this).
_MAX_SUSPENDED = 20_000
#: Outcomes queued for the next report.
_MAX_QUEUED = 1024


@dataclass(slots=True)
class _Probe:
    session: str
    branch: str
    suspended_at: float
    ttl_s: float | None
    resumed_at: float


class ResumeTracker:
    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall = wall_clock
        #: Session -> (suspension time, wall clock; host timer, seconds after it or None;
        #: branch).
        self._suspended: OrderedDict[str, tuple[float, float | None, str]] = OrderedDict()
        self.outcomes: deque[ResumeOutcome] = deque(maxlen=_MAX_QUEUED)

    def __len__(self) -> int:
        return len(self._suspended)

    def __contains__(self, session: object) -> bool:
        return session in self._suspended

    def suspended(
        self, session: str, issued_at: float, ttl_s: float | None, *, repriced: bool = False
    ) -> None:
        """A suspension with a host timer of ``ttl_s`` after ``issued_at`` (``None``: none);
        ``repriced``: a ttl-branch timer the rent clock moves (ttl even while it is none)."""
        branch = "ttl" if repriced or ttl_s is not None else "retain"
        self._suspended[session] = (issued_at or self._wall(), ttl_s, branch)
        self._suspended.move_to_end(session)
        while len(self._suspended) > _MAX_SUSPENDED:
            self._suspended.popitem(last=False)

    def retime(self, session: str, expires_at: float | None) -> None:
        """A re-priced timer: the host copy now expires at ``expires_at`` (Unix s; ``None``:
        held until resume), so a resume reports how long it was really held."""
        entry = self._suspended.get(session)
        if entry is not None:
            at, _, branch = entry
            ttl = None if expires_at is None else max(0.0, expires_at - at)
            self._suspended[session] = (at, ttl, branch)

    def forget(self, session: str) -> None:
        self._suspended.pop(session, None)

    def start(self, session: str | None, ctx: ReqContext) -> None:
        """A request starts: if its session was suspended, this is the resume to classify."""
        if session is None:
            return
        entry = self._suspended.pop(session, None)
        if entry is None:
            return
        at, ttl, branch = entry
        ctx.set_state(_Probe(session, branch, at, ttl, self._wall()))

    def finish(self, ctx: ReqContext, lookup_end: int | None, loaded_blocks: int) -> None:
        """The request ended. ``lookup_end``: the end token of the first block vLLM looked up
        (``None``: no lookup); ``loaded_blocks``: blocks loaded from the tier (both recorded
        on the request's :class:`~tenure.engine_adapter.requests.RequestInfo`)."""
        probe = ctx.get_state(_Probe)
        if probe is None:
            return
        ctx._state.pop(_Probe, None)  # once per request
        positions = sorted(set(offload_key_positions(ctx).values()))
        if not positions:
            return
        block = positions[0]
        prompt = positions[-1]
        hbm = prompt if lookup_end is None else max(0, lookup_end - block)
        host = min(prompt - hbm, loaded_blocks * block)
        computed = max(0, prompt - hbm - host)
        outcome = max(
            (("hbm", hbm), ("host", host), ("recomputed", computed)),
            key=lambda item: item[1],
        )[0]
        wait = max(0.0, probe.resumed_at - probe.suspended_at)
        held = wait if probe.ttl_s is None else min(wait, probe.ttl_s)
        tenant = probe.session.split("/", 1)[0] if "/" in probe.session else ""
        self.outcomes.append(
            ResumeOutcome(
                tenant=tenant,
                branch=probe.branch,
                outcome=outcome,
                wait_s=wait,
                host_held_s=held,
                prompt_tokens=prompt,
                hbm_tokens=hbm,
                host_tokens=host,
                computed_tokens=computed,
            )
        )

    def drain(self, limit: int = 256) -> list[ResumeOutcome]:
        out: list[ResumeOutcome] = []
        while self.outcomes and len(out) < limit:
            try:
                out.append(self.outcomes.popleft())
            except IndexError:
                break
        return out
