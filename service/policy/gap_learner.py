"""Hint-free gap learning: each session's next idle gap from what the traffic itself shows.

Without stop reasons (a route that sends none, a trace that records none) the gate still needs
a wake-up for every idle session. One global quantile of the gaps seen so far (the old tags-off
horizon) gives every session the same wake-up, so the gate can only order them by idle time and
must refuse every newcomer while the residents are inside that horizon. This learner instead
keeps, per tenant, the *distribution* of idle gaps and of session ends, conditioned on what a
session has shown so far, and predicts a per-session distribution:

* **Gap histogram by context.** Observed gaps (a request's start minus its session's previous
  completion) go into log-spaced bins (``2**(1/4)`` wide from 0.25 s), per tenant, both into a
  tenant-wide histogram and into one per *context*: how many turns the session has completed
  (1, 2, 3, 4-7, 8+) and the bucket of its previous gap (none, < 10 s, < 60 s, < 600 s,
  longer). Agent traffic is bursty (a tool loop's gaps follow short gaps; a human's pause
  follows a finished exchange), which the context captures without a stop reason.
* **The session's own gaps.** A session that has shown mostly short gaps is mixed in with the
  weight ``n / (n + session_weight)`` of its own ``n`` recent gaps.
* **Ends.** Many sessions never come back (on the Mooncake conversation trace 87% of sessions
  are one call). A session idle past ``end_after`` (``end_factor`` times the tenant's 99th gap
  percentile, at least ``end_min_s``) is counted as *ended* after its turn count; if it comes
  back the count is moved to *returned* and its gap is learned like any other. The chance of a
  next turn after ``k`` turns is a Beta-smoothed share, backed off to the tenant's overall
  share, so the predicted distribution has an atom at infinity.

The mixture is hierarchical shrinkage (a context with few samples leans on the tenant-wide
histogram, which leans on a prior), not one fitted parametric family, so it keeps the bimodal
shape of agent gaps (seconds after a tool call, minutes to hours after a human turn) that a
single fitted log-normal smooths away. :meth:`GapLearner.quantile` answers the gate's question
(the wake-up at a chosen quantile, if the session comes back) and
:meth:`GapLearner.return_probability` whether it comes back at all.

Pure Python, O(bins) per observation and per prediction, no clock reads (``now`` is an
argument), no numpy: the sidecar's no-extras install and the vLLM adapter import it. Tenants
are isolated: the tenant is the part of a scoped session id before ``/`` (``tenant/session``,
as the sidecar scopes them), and one tenant's observations never enter another's model.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left
from dataclasses import dataclass, field
from itertools import accumulate
from statistics import NormalDist

__all__ = ["MODELS", "GapLearner", "tenant_of"]

#: Bin edges: ``_LO * _RATIO**i`` for ``i`` in ``0.._BINS``; bin 0 also takes everything below,
#: the last bin everything above (4.2e6 s, seven weeks).
_LO = 0.25
_RATIO = 2.0**0.25
_BINS = 96
_LOG_RATIO = math.log(_RATIO)
#: Completed-turn buckets (1, 2, 3, 4-7, 8+) and previous-gap buckets (none, <10, <60, <600, more).
_TURN_CAP = 4
_GAP_EDGES = (10.0, 60.0, 600.0)
#: How often (in observed gaps) a tenant's end threshold is recomputed.
_END_EVERY = 32
#: The session's own most recent gaps kept.
_OWN = 16
#: Gaps below this count as this in the log-normal fit (a zero gap has no logarithm).
_MIN_GAP = 0.01
#: What :meth:`GapLearner.distribution` mixes: everything (the learner), the tenant-wide
#: histogram alone, or one log-normal fitted per tenant (the llm-d-style baseline).
MODELS = ("mixture", "tenant", "lognormal")


def tenant_of(session: str) -> str:
    """The tenant part of a scoped session id (``tenant/session``); ``""`` when unscoped."""
    head, sep, _ = session.partition("/")
    return head if sep else ""


def _edge(x: float) -> float:
    """The gap at fractional bin position ``x`` (bin ``i`` spans ``_edge(i)`` to ``_edge(i+1)``)."""
    return _LO * math.exp(x * _LOG_RATIO)


def _bin(gap: float) -> int:
    if gap <= _LO:
        return 0
    return min(_BINS - 1, int(math.log(gap / _LO) / _LOG_RATIO))


def _turn_bucket(turns: int) -> int:
    if turns <= 3:
        return max(0, turns - 1)
    return 3 if turns < 8 else _TURN_CAP


def _gap_bucket(gap: float | None) -> int:
    if gap is None:
        return 0
    for i, edge in enumerate(_GAP_EDGES):
        if gap < edge:
            return i + 1
    return len(_GAP_EDGES) + 1


class _Histogram:
    """Counts of gaps in log bins, halved once they pass ``window`` (recent traffic counts),
    with the sums a log-normal fit needs (the ``lognormal`` ablation)."""

    __slots__ = ("counts", "log_sq", "log_sum", "total", "window")

    def __init__(self, window: float) -> None:
        self.counts = [0.0] * _BINS
        self.total = 0.0
        self.log_sum = 0.0
        self.log_sq = 0.0
        self.window = window

    def add(self, gap: float) -> None:
        self.counts[_bin(gap)] += 1.0
        self.total += 1.0
        x = math.log(max(gap, _MIN_GAP))
        self.log_sum += x
        self.log_sq += x * x
        if self.total > self.window:
            self.counts = [c * 0.5 for c in self.counts]
            self.total *= 0.5
            self.log_sum *= 0.5
            self.log_sq *= 0.5


@dataclass(slots=True)
class _Tenant:
    window: float
    overall: _Histogram = field(init=False)
    contexts: dict[tuple[int, int], _Histogram] = field(default_factory=dict)
    #: Per completed-turn bucket: sessions that came back, sessions counted as ended.
    returned: list[float] = field(default_factory=lambda: [0.0] * (_TURN_CAP + 1))
    ended: list[float] = field(default_factory=lambda: [0.0] * (_TURN_CAP + 1))
    observed: int = 0  # gaps ever observed (not halved)
    #: ``end_after`` as last computed, and the ``observed`` count it was computed at.
    end_cache: tuple[int, float] = (-1, 0.0)

    def __post_init__(self) -> None:
        self.overall = _Histogram(self.window)


@dataclass(slots=True)
class _Session:
    turns: int = 0  # completed turns
    prev_gap: float | None = None
    own: list[int] = field(default_factory=list)  # bins of its most recent gaps
    idle_since: float | None = None  # completion time while idle, None while active
    ended_bucket: int | None = None  # counted as ended after this turn bucket


@dataclass(slots=True)
class _Mixture:
    """A predicted distribution as its terms: ``scale x counts`` of the tenant histogram and of
    the context histogram, plus point masses (own gaps, the prior) by bin."""

    overall: _Histogram | None
    overall_scale: float
    ctx: _Histogram | None
    ctx_scale: float
    extra: dict[int, float]

    def mass(self, i: int) -> float:
        m = self.extra.get(i, 0.0)
        if self.overall is not None:
            m += self.overall_scale * self.overall.counts[i]
        if self.ctx is not None:
            m += self.ctx_scale * self.ctx.counts[i]
        return m


class GapLearner:
    """Per-tenant, per-session distribution of the next idle gap (with an atom for 'ended').

    Feed it :meth:`on_start` at every request start and :meth:`on_idle` at every completion
    (the gate does, from its ``on_request_start`` / ``on_access`` hooks, on every path that
    drives a policy: replay, adapter). Queries (:meth:`quantile`, :meth:`return_probability`)
    change nothing.
    """

    def __init__(
        self,
        *,
        prior_gap_s: float = 30.0,
        prior_weight: float = 1.0,
        context_weight: float = 20.0,
        session_weight: float = 8.0,
        prior_return: float = 0.95,
        return_weight: float = 4.0,
        end_factor: float = 2.0,
        end_min_s: float = 600.0,
        window: float = 4096.0,
        min_samples: int = 5,
        learn_ends: bool = True,
        model: str = "mixture",
    ) -> None:
        if model not in MODELS:
            raise ValueError(f"model must be one of {', '.join(MODELS)}")
        if not prior_gap_s > 0 or not 0.0 < prior_return <= 1.0:
            raise ValueError("prior_gap_s must be > 0 and prior_return in (0, 1]")
        if min(prior_weight, context_weight, session_weight, return_weight) < 0:
            raise ValueError("weights must be >= 0")
        if end_factor <= 0 or end_min_s <= 0 or window < 2:
            raise ValueError("end_factor and end_min_s must be > 0, window >= 2")
        self.prior_bin = _bin(prior_gap_s)
        self.prior_weight = prior_weight
        self.context_weight = context_weight
        self.session_weight = session_weight
        self.prior_return = prior_return
        self.return_weight = return_weight
        self.end_factor = end_factor
        self.end_min_s = end_min_s
        self.window = window
        self.learn_ends = learn_ends
        self.min_samples = min_samples
        self.model = model
        self._tenants: dict[str, _Tenant] = {}
        self._sessions: dict[str, _Session] = {}
        # Idle sessions by completion time, to count ends lazily (stale entries skipped).
        self._idle: list[tuple[float, str]] = []

    # --- observations -------------------------------------------------------------------

    def _tenant(self, session: str) -> _Tenant:
        name = tenant_of(session)
        tenant = self._tenants.get(name)
        if tenant is None:
            tenant = self._tenants[name] = _Tenant(self.window)
        return tenant

    def on_start(self, session: str, now: float) -> None:
        """A request of ``session`` starts: learn the gap it ended (if it was idle)."""
        self._sweep(now)
        state = self._sessions.get(session)
        if state is None:
            self._sessions[session] = _Session()
            return
        if state.idle_since is None:
            return  # already active (a second request in flight): no gap ended
        gap = max(0.0, now - state.idle_since)
        tenant = self._tenant(session)
        bucket = _turn_bucket(state.turns)
        if state.ended_bucket is not None:
            # It was counted as ended and came back after all: move the count.
            tenant.ended[state.ended_bucket] = max(0.0, tenant.ended[state.ended_bucket] - 1)
            state.ended_bucket = None
        tenant.returned[bucket] += 1.0
        tenant.observed += 1
        tenant.overall.add(gap)
        key = (bucket, _gap_bucket(state.prev_gap))
        hist = tenant.contexts.get(key)
        if hist is None:
            hist = tenant.contexts[key] = _Histogram(self.window)
        hist.add(gap)
        state.prev_gap = gap
        state.own.append(_bin(gap))
        if len(state.own) > _OWN:
            del state.own[0]
        state.idle_since = None

    def on_idle(self, session: str, now: float) -> None:
        """A request of ``session`` completed: it is idle from ``now``."""
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session()
        state.turns += 1
        state.idle_since = now
        if self.learn_ends:
            heapq.heappush(self._idle, (now, session))
        self._sweep(now)

    def forget(self, session: str) -> None:
        """``session`` is gone: count it as ended (if idle and not yet counted), drop its state."""
        state = self._sessions.pop(session, None)
        idle = state is not None and state.idle_since is not None
        if idle and state is not None and state.ended_bucket is None and self.learn_ends:
            self._tenant(session).ended[_turn_bucket(state.turns)] += 1.0

    def _sweep(self, now: float) -> None:
        """Count every session idle past its tenant's end threshold as ended."""
        idle = self._idle
        while idle:
            since, session = idle[0]
            state = self._sessions.get(session)
            if state is None or state.idle_since != since or state.ended_bucket is not None:
                heapq.heappop(idle)
                continue
            tenant = self._tenant(session)
            if now - since <= self.end_after(tenant):
                return
            heapq.heappop(idle)
            state.ended_bucket = _turn_bucket(state.turns)
            tenant.ended[state.ended_bucket] += 1.0

    def end_after(self, tenant: _Tenant) -> float:
        """Idle this long, a session of ``tenant`` counts as ended (recomputed every
        ``_END_EVERY`` observed gaps: a 99th percentile moves slowly, and this is asked on
        every request)."""
        stamp, value = tenant.end_cache
        if stamp >= 0 and tenant.observed - stamp < _END_EVERY:
            return value
        p99 = _quantile(tenant.overall.counts, tenant.overall.total, 0.99)
        value = self.end_min_s if p99 is None else max(self.end_min_s, self.end_factor * p99)
        tenant.end_cache = (tenant.observed, value)
        return value

    # --- queries --------------------------------------------------------------------------

    def ready(self, session: str) -> bool:
        """Whether ``session``'s tenant has shown enough gaps to predict from (else the caller
        keeps its own fallback)."""
        tenant = self._tenants.get(tenant_of(session))
        return tenant is not None and tenant.observed >= self.min_samples

    def return_probability(self, session: str, *, pending_turn: bool = False) -> float:
        """Chance that ``session`` sends another request after its completed turns (and the
        one in flight, with ``pending_turn``)."""
        tenant = self._tenants.get(tenant_of(session))
        if tenant is None or not self.learn_ends:
            return self.prior_return
        bucket = _turn_bucket(self._turns(session, pending_turn))
        k = self.return_weight
        back, ends = sum(tenant.returned), sum(tenant.ended)
        overall = (back + k * self.prior_return) / (back + ends + k)
        back, ends = tenant.returned[bucket], tenant.ended[bucket]
        return (back + k * overall) / (back + ends + k)

    def _turns(self, session: str, pending_turn: bool) -> int:
        state = self._sessions.get(session)
        turns = state.turns if state is not None else 0
        return max(1, turns + 1 if pending_turn else turns)

    def _parts(self, session: str, pending_turn: bool) -> _Mixture:
        """The mixture's terms: tenant histogram (with a prior pseudo-count), context, own."""
        tenant = self._tenants.get(tenant_of(session))
        if tenant is None or tenant.overall.total <= 0:
            return _Mixture(None, 0.0, None, 0.0, {self.prior_bin: 1.0})
        overall = tenant.overall
        base = 1.0  # the weight left for the tenant histogram and its prior
        extra: dict[int, float] = {}
        ctx: _Histogram | None = None
        ctx_scale = 0.0
        state = self._sessions.get(session) if self.model == "mixture" else None
        if state is not None and state.own:
            n = len(state.own)
            w = n / (n + self.session_weight)
            for i in state.own:
                extra[i] = extra.get(i, 0.0) + w / n
            base -= w
        if self.model == "mixture":
            prev = state.prev_gap if state is not None else None
            turns = _turn_bucket(self._turns(session, pending_turn))
            ctx = tenant.contexts.get((turns, _gap_bucket(prev)))
            if ctx is not None and ctx.total > 0:
                w = ctx.total / (ctx.total + self.context_weight)
                ctx_scale = base * w / ctx.total
                base *= 1.0 - w
            else:
                ctx = None
        total = overall.total + self.prior_weight
        extra[self.prior_bin] = extra.get(self.prior_bin, 0.0) + base * self.prior_weight / total
        return _Mixture(overall, base / total, ctx, ctx_scale, extra)

    def distribution(self, session: str, *, pending_turn: bool = False) -> list[float]:
        """The predicted next gap of ``session`` over the log bins (sums to 1, ends excluded);
        ``pending_turn``: the gap after the request now in flight."""
        parts = self._parts(session, pending_turn)
        return [parts.mass(i) for i in range(_BINS)]

    def quantile(self, session: str, q: float, *, pending_turn: bool = False) -> float:
        """The ``q`` quantile of the next gap *if* the session comes back (ends excluded: ask
        :meth:`return_probability` for those)."""
        if not 0.0 < q < 1.0:
            raise ValueError("q must be in (0, 1)")
        if self.model == "lognormal":
            return self._lognormal_quantile(session, q)
        # Cumulative masses built at C speed (accumulate), then a bisection over the bins: it
        # is asked on every idle entry and every refused-or-not store of an unhinted session.
        parts = self._parts(session, pending_turn)
        if parts.overall is None:
            base = [0.0] * _BINS
        elif parts.ctx is None:
            a = parts.overall_scale
            base = [a * c for c in parts.overall.counts]
        else:
            a, b = parts.overall_scale, parts.ctx_scale
            base = [
                a * c + b * d for c, d in zip(parts.overall.counts, parts.ctx.counts, strict=True)
            ]
        for i, m in parts.extra.items():
            base[i] += m
        cum = list(accumulate(base))
        i = bisect_left(cum, q)
        if i >= _BINS:
            return math.inf
        before = cum[i - 1] if i > 0 else 0.0
        m = base[i]
        return _edge(i + ((q - before) / m if m > 0 else 1.0))

    def _lognormal_quantile(self, session: str, q: float) -> float:
        """One log-normal per tenant, fitted to its gaps (moments of the log)."""
        tenant = self._tenants.get(tenant_of(session))
        prior = _edge(self.prior_bin + 0.5)
        if tenant is None or tenant.overall.total < 2:
            return prior
        h = tenant.overall
        mean = h.log_sum / h.total
        var = max(0.0, h.log_sq / h.total - mean * mean)
        if var <= 0:
            return math.exp(mean)
        return math.exp(NormalDist(mean, math.sqrt(var)).inv_cdf(q))


def _quantile(counts: list[float], total: float, q: float) -> float | None:
    """The ``q`` quantile of binned counts, log-interpolated inside its bin."""
    if total <= 0:
        return None
    target = q * total
    acc = 0.0
    for i, c in enumerate(counts):
        if c <= 0:
            continue
        if acc + c >= target:
            frac = (target - acc) / c
            return _edge(i + frac)
        acc += c
    last = max((i for i, c in enumerate(counts) if c > 0), default=_BINS - 1)
    return _edge(last + 1)
