"""Requests and their sessions: tags read once per request, untagged ones inferred.

A request's state (:class:`RequestInfo`) is cached in its ``ReqContext``. An untagged request
continues the session whose newest (frontier) block is the deepest of its keys resident here;
otherwise it starts an anonymous session.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import OffloadKey, ReqContext

from tenure.engine_adapter.holdings import Holdings
from tenure.engine_adapter.key_map import Loc
from tenure.engine_adapter.pushed import Pushed
from tenure.engine_adapter.resumes import ResumeTracker
from tenure.engine_adapter.sessions import Sessions
from tenure.engine_adapter.tags import RequestTags, parse_tags
from tenure.engine_adapter.vllm_compat import offload_key_positions
from tenure.service.policy import SessionHint

__all__ = ["RequestInfo", "Requests"]


@dataclass(slots=True)
class RequestInfo:
    """Per-request state, cached in the request's ``ReqContext``.

    ``owner`` is the generation token of the :class:`Requests` that made it: a ``clear()``
    (vLLM's ``reset_cache``) builds a new one, so state cached before it (segment ids of the
    old tier) is never trusted after.
    """

    owner: object
    tags: RequestTags
    session: str | None
    #: The request's id in the core (request-scoped ranks: vLLM 0.33's LRU).
    serial: int = 0
    seg: int = -1
    next_index: int = 0
    started: bool = False
    #: The engine admitted the request (its first load or store): the core was told.
    admitted: bool = False
    #: The end token of the first block vLLM looked up in the tier (its lookups start where
    #: the GPU prefix hit ends; ``None``: no lookup, the GPU held every full block).
    lookup_end: int | None = None
    #: Blocks loaded from the tier for the request.
    loaded: int = 0
    inserted: list[OffloadKey] = field(default_factory=list)
    #: The last offer the gate refused, as (new blocks, last new key): vLLM re-offers a
    #: refused range at every engine step, and a repeat is not counted as another refusal.
    refused_offer: tuple[int, OffloadKey] | None = None


class Requests:
    """Session inference and request starts (hints told to the core once per change)."""

    __slots__ = (
        "epoch",
        "holdings",
        "keys",
        "last_ctx",
        "pushed",
        "reports_lookups",
        "resumes",
        "serial",
        "sessions",
        "stats",
        "tier",
    )

    def __init__(
        self,
        *,
        holdings: Holdings,
        sessions: Sessions,
        pushed: Pushed,
        stats: Counter[str],
        resumes: ResumeTracker,
    ) -> None:
        self.keys = holdings.keys
        self.tier = holdings.tier
        self.holdings = holdings
        self.sessions = sessions
        self.pushed = pushed
        self.stats = stats
        self.resumes = resumes
        #: This generation's token (a plain object: cached state keeps no old tier alive).
        self.epoch = object()
        #: The last request numbered (its :attr:`RequestInfo.serial`).
        self.serial = 0
        #: The request of the newest store (set by the store gate and vLLM's stock-manager
        #: path): the request of a call that names none.
        self.last_ctx: ReqContext | None = None
        #: Tenure's manager passes vLLM's lookups and loads on (:meth:`looked_up`,
        #: :meth:`loading`), so an admission can tell the core what the request looked up and
        #: found. Under vLLM's stock manager no lookup is seen: nothing is reported then,
        #: rather than every request as one the GPU served whole.
        self.reports_lookups = False

    def request(self, ctx: ReqContext | None, now: float, *, infer: bool = True) -> RequestInfo:
        """``ctx``'s state (the newest store's request when ``ctx`` is ``None``), started."""
        if ctx is None:
            ctx = self.last_ctx
        info = ctx.get_state(RequestInfo) if ctx is not None else None
        if info is None or info.owner is not self.epoch:
            tags = parse_tags(ctx.kv_transfer_params if ctx is not None else None)
            if tags.invalid:
                self.stats["invalid_tags"] += tags.invalid
            self.serial += 1
            info = RequestInfo(
                owner=self.epoch, tags=tags, session=tags.session_id, serial=self.serial
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

    def admit(self, info: RequestInfo, ctx: ReqContext | None, now: float) -> None:
        """The engine runs the request (it loads or stores): tell the core once, so that from
        now on its session's copy is off limits (queued, it may give way to a denser store),
        and what its lookup found, as the replay does at admission.

        The lookup is told in blocks past the GPU hit, of which the loaded ones were the host
        hit; blocks never stored here count too, since the request computes them.
        """
        if info.admitted or info.session is None or not info.started:
            return
        info.admitted = True
        self.tier.request_admitted(info.session, now)
        if not self.reports_lookups or ctx is None:
            return
        unit = self.keys.block_tokens
        positions = offload_key_positions(ctx)
        if unit <= 0 or not positions:
            return
        prompt = max(positions.values()) // unit
        gpu = prompt if info.lookup_end is None else info.lookup_end // unit - 1
        blocks = max(0, prompt - gpu)
        self.tier.looked_up(info.session, blocks, min(info.loaded, blocks), now)

    @staticmethod
    def looked_up(key: OffloadKey, ctx: ReqContext) -> None:
        """vLLM looked ``key`` up for the request (from its GPU hit on, key by key)."""
        info = ctx.get_state(RequestInfo)
        if info is None:
            return
        end = ctx.get_offload_key_position(key)
        if end is not None and (info.lookup_end is None or end < info.lookup_end):
            info.lookup_end = end

    def loading(self, keys: int, ctx: ReqContext, now: float) -> RequestInfo:
        """vLLM loads ``keys`` blocks for the request. Counted before the load is passed on,
        since vLLM 0.33's manager reports the access (and so the admission) inside it."""
        info = self.request(ctx, now, infer=False)
        info.loaded += keys
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
            loc_of = self.keys.loc.get
            for key in positions:
                loc = loc_of(key)
                if loc is not None and (deepest is None or loc[1] >= deepest[1]):
                    deepest = loc
            if deepest is not None and deepest[1] + 1 == self.keys.frontier[deepest[0]]:
                return self.tier.owner(deepest[0])
        self.stats["untagged_requests"] += 1
        return f"anon-{ctx.req_id if ctx is not None else self.stats['untagged_requests']}"

    def _start(self, info: RequestInfo, now: float) -> None:
        session = info.session
        assert session is not None
        info.started = True
        sessions = self.sessions
        if session not in sessions.held:
            sessions.held.add(session)
            if info.tags.turn > 1:
                # Earlier turns ran elsewhere (a router moved the session, or this engine
                # restarted): its KV is cold here. The sidecar counts these as moves.
                self.stats["cold_sessions"] += 1
        info.seg = self.keys.segment(session, info.tags.segment)
        self.tier.request_start(session, now)
        sessions.ended.discard(session)
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
            if hint.last_turn or sessions.last_hint.get(session) != hint:
                if hint.last_turn:
                    sessions.last_hint.pop(session, None)
                else:
                    sessions.last_hint[session] = hint
                self.holdings.drop_victims(self.tier.hint(session, hint, now), now)
        self.pushed.refresh_timer()

    def on_new_request(self, ctx: ReqContext, now: float) -> None:
        """A request reached the scheduler: its session is active from now."""
        info = self.request(ctx, now, infer=False)
        self.resumes.start(info.session, ctx)
