"""Requests and their sessions: tags read once per request, untagged ones inferred.

A request's state (:class:`~tenure.engine_adapter.policy_state.RequestInfo`) is cached in its
``ReqContext``. An untagged request continues the session whose newest (frontier) block is the
deepest of its keys resident here; otherwise it starts an anonymous session.
"""

from __future__ import annotations

from vllm.v1.kv_offload.base import ReqContext

from tenure.engine_adapter.policy_state import Loc, RequestInfo
from tenure.engine_adapter.pushed import PushedDecisions
from tenure.engine_adapter.tags import parse_tags
from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.policy import SessionHint

__all__ = ["Requests"]


class Requests(PushedDecisions):
    """Session inference and request starts (hints told to the core once per change)."""

    def _request(self, ctx: ReqContext | None, now: float, *, infer: bool = True) -> RequestInfo:
        if ctx is None:
            ctx = self._last_ctx
        info = ctx.get_state(RequestInfo) if ctx is not None else None
        if info is None or info.owner is not self._epoch:
            tags = parse_tags(ctx.kv_transfer_params if ctx is not None else None)
            if tags.invalid:
                self.stats["invalid_tags"] += tags.invalid
            self._request_serial += 1
            info = RequestInfo(
                owner=self._epoch,
                tags=tags,
                session=tags.session_id,
                serial=self._request_serial,
            )
            if ctx is not None:
                ctx.set_state(info)
        if info.session is None:
            if not infer:
                # Untagged: the prefix chain is known only once vLLM has hashed the request's
                # blocks (after on_new_request); the session is inferred at its first store.
                return info
            info.session = self._infer_session(ctx)
        if not info.started:
            self._start(info, now)
        return info

    def _infer_session(self, ctx: ReqContext | None) -> str:
        """Prefix-chain inference for untagged requests.

        The request continues a session when the deepest of its keys that is resident here is
        that session's frontier block (its newest); a prefix shared only partly (a common
        system prompt) starts a new anonymous session instead.
        """
        positions = offload_key_positions(ctx)
        if positions:
            deepest: Loc | None = None
            for key in positions:
                loc = self._loc.get(key)
                if loc is not None and (deepest is None or loc[1] >= deepest[1]):
                    deepest = loc
            if deepest is not None and deepest[1] + 1 == self._frontier[deepest[0]]:
                return self.tier.owner(deepest[0])
        self.stats["untagged_requests"] += 1
        return f"anon-{ctx.req_id if ctx is not None else self.stats['untagged_requests']}"

    def _start(self, info: RequestInfo, now: float) -> None:
        session = info.session
        assert session is not None
        info.started = True
        if session not in self._held:
            self._held.add(session)
            if info.tags.turn > 1:
                # Earlier turns ran elsewhere (a router moved the session, or this engine
                # restarted): its KV is cold here. The sidecar counts these as moves.
                self.stats["cold_sessions"] += 1
        info.seg = self._segment(session, info.tags.segment)
        self.tier.request_start(session, now)
        self._ended.discard(session)
        tags = info.tags
        if tags.expected_gap_s is not None or tags.last_turn or tags.suspended:
            hint = SessionHint(
                expected_gap_s=tags.expected_gap_s,
                last_turn=tags.last_turn,
                suspended=tags.suspended,
            )
            # Most turns repeat the session's previous hint: telling the core again changes
            # nothing for an active session, so skip it. A last turn is always told (the core
            # clears the declaration once it reclaims).
            if hint.last_turn or self._last_hint.get(session) != hint:
                if hint.last_turn:
                    self._last_hint.pop(session, None)
                else:
                    self._last_hint[session] = hint
                self._drop_victims(self.tier.hint(session, hint, now), now)
        self._refresh_timer()

    def on_new_request(self, ctx: ReqContext, now: float | None = None) -> None:
        """A request reached the scheduler: its session is active from now."""
        info = self._request(ctx, self._clock() if now is None else now, infer=False)
        self.resumes.start(info.session, ctx)
