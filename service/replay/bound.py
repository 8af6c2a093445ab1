"""An upper bound on the prefill work a host tier of a given capacity could have saved.

Input: the *access log* of one replay run (:class:`Access`, in admission order): for each request
its context runs, its admission time ``L`` (when the connector looked the host tier up), its
completion time ``C``, and its GPU prefix hit ``g`` in blocks. A host tier can only serve the
blocks ``[g, n)`` of a request beyond the GPU hit, and a hit counts only with its whole prefix:
the tier serves ``[g, g + h)``, all of them resident. Serving block ``p`` saves the work of
prefilling it, ``w(p) = alpha + beta * p`` (its dense FLOPs plus its attention over the ``p``
blocks before it; :func:`block_work`), so a deep block is worth more than a shallow one. The bound
is on ``sum over requests of w([g, g + h))``, what :func:`saved_work` measures for a real run.

**The relaxation.** Every policy's run satisfies four facts, and the bound is the optimum of a
linear program that keeps only (weakened forms of) them, so no policy can exceed it:

1. *Availability.* A block resident at request ``r``'s lookup ``L_r`` was stored by an earlier
   admitted request ``r'`` whose context holds it (vLLM's connector stores only computed
   blocks of running requests), at a time ``s <= min(C_r', L_r)``, and stayed resident over
   ``[s, L_r)``. Hence it was resident over ``[A, L_r)`` with ``A = min(max C_r', L_r)``, the
   max over earlier-admitted requests holding it. A block no earlier request held cannot hit.
   For consecutive holders ``k, k+1`` of one block, ``A_{k+1} >= min(C_k, L_{k+1}) >= L_k``, so a
   block's intervals are disjoint and each costs one block of capacity while it runs.
2. *Capacity.* At every instant at most ``capacity`` blocks are resident. Counting only the
   blocks that will hit, and only over their intervals ``[A, L)``, undercounts residency, so
   the constraint still holds for the relaxed quantities.
3. *Prefix.* Within a request the hit indicator ``y_p`` is non-increasing in ``p`` over
   ``[g, n)`` and ``w`` is increasing, so by Chebyshev's sum inequality, for any subset ``G``
   of the request's eligible blocks, ``sum_{p in G} w_p y_p <= mean_G(w) * sum_{p in G} y_p``.
4. *Grouping.* The eligible blocks of a request that share one ``A`` form a group with one
   interval, size ``S`` (blocks), and value ``W = S * mean(w)``; the fraction ``z = (hits in the
   group) / S`` of a real run is in ``[0, 1]``, uses ``z * S`` capacity over ``[A, L)``, and is
   credited ``z * W >=`` the work its hits saved (fact 3).

So every run maps to a feasible point of the LP ``max sum W_i z_i`` subject to ``0 <= z_i <= 1``
and, at every time, ``sum of S_i z_i over the intervals covering it <= capacity``, with a value
at least the work the run saved; the LP optimum is an upper bound. Groups with ``A >= L`` (a
holder still running at the lookup: free in the relaxation) are credited whole, outside the
LP. This is FOO's interval LP (Berger, Beckmann, Harchol-Balter, SIGMETRICS 2018) on groups of
blocks instead of objects; dropping the cross-group prefix constraints and the placement of
stores inside a request only loosens it. The LP has the consecutive-ones structure, so it is
written as a flow along the time line (a load variable per time step, two non-zeros per
interval) and solved with HiGHS (:func:`scipy.optimize.linprog`).

The bound is for *that run's* access sequence (which GPU hits it had and when requests ran
depend on the policy), as the issue asks; ``saved / bound`` is a policy's share of it.

**A tighter bound for engines that store during the prefill** (``prefill_stores=True``).
vLLM's connector stores prompt blocks only (``offload_prompt_only``, its default), as the
prefill computes them; the replay's engine does the same (:mod:`tenure.service.replay.batching`
offers computed prompt blocks at each prefill step and never after the prefill's last one). So
fact 1 holds with the holder's prefill end ``F_r'`` (``Access.first_token_s``) in place of its
completion: ``s <= min(F_r', L_r)``, and every argument above goes through with
``A = min(max F_r', L_r)``. Where a request's ``first_token_s`` is unknown (negative) its
completion is used, so the flag never loosens the bound. On the acceptance point's runs (seeds
0-2, four policies) it is 0.87-0.89 of the completion-timed bound: about an eighth of that
bound credited holds that begin while the holder still decodes, which no policy can make.
The ladders keep the completion-timed bound as ``saved/bound`` (every table since it was
introduced is on it) and report this one beside it (``saved_over_bound_prefill``).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tenure.service.policy.types import Run
from tenure.service.replay.hardware import HardwareProfile

__all__ = ["Access", "BlockWork", "Bound", "block_work", "prefill_bound", "saved_work"]


@dataclass(frozen=True, slots=True)
class BlockWork:
    """``w(p) = alpha + beta * p``: FLOPs to prefill block ``p`` of a context."""

    alpha: float
    beta: float

    def range(self, lo: int, hi: int) -> float:
        """Work of blocks ``[lo, hi)``."""
        if hi <= lo:
            return 0.0
        n = hi - lo
        return self.alpha * n + self.beta * (lo + hi - 1) * n / 2.0


def block_work(hw: HardwareProfile, block_tokens: int) -> BlockWork:
    """The roofline's prefill FLOPs per block (:meth:`HardwareProfile.step_seconds`).

    Token ``x`` costs ``2 * params`` dense FLOPs plus ``4 * layers * width`` per context token it
    attends to (``x + 1``); summed over the ``bt`` tokens of block ``p``.
    """
    bt = block_tokens
    attn = 4.0 * hw.layers * hw.attention_width
    return BlockWork(
        alpha=2.0 * hw.params * bt + attn * bt * (bt + 1) / 2.0,
        beta=attn * bt * bt,
    )


@dataclass(frozen=True, slots=True)
class Access:
    """One request of a run: context runs in prefix order, lookup and completion times, GPU hit."""

    runs: tuple[Run, ...]
    lookup_s: float
    done_s: float
    gpu_hit: int
    host_hit: int = 0
    #: When its prefill ended (the last moment vLLM's connector offers its computed blocks);
    #: read only by the ``vllm_offers`` diagnostic.
    first_token_s: float = -1.0


@dataclass(frozen=True, slots=True)
class Bound:
    """The bound and how it was reached."""

    work: float  # the upper bound on saved prefill work (FLOPs)
    free_work: float  # part of it credited outside the LP (holder running at the lookup)
    intervals: int  # LP variables
    time_points: int
    seconds: float  # wall time of the whole computation
    status: str


@dataclass(slots=True)
class _Intervals:
    """LP variables: interval ``[start, end)``, size (blocks), value (work); prefix chains."""

    start: list[float] = field(default_factory=list)
    end: list[float] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    #: ``(i, j)``: ``i`` precedes ``j`` in one request's prefix, so ``z_i >= z_j``.
    chain: list[tuple[int, int]] = field(default_factory=list)
    free: float = 0.0


class _Pieces:
    """A piecewise-constant value over a segment's blocks, with range-max updates."""

    __slots__ = ("starts", "vals")

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.vals: list[float] = [-np.inf]

    def _split(self, x: int) -> int:
        i = bisect_right(self.starts, x) - 1
        if self.starts[i] == x:
            return i
        self.starts.insert(i + 1, x)
        self.vals.insert(i + 1, self.vals[i])
        return i + 1

    def query(self, lo: int, hi: int) -> Iterable[tuple[int, int, float]]:
        i = bisect_right(self.starts, lo) - 1
        starts, vals = self.starts, self.vals
        while i < len(starts) and starts[i] < hi:
            end = starts[i + 1] if i + 1 < len(starts) else hi
            yield max(lo, starts[i]), min(hi, end), vals[i]
            i += 1

    def raise_to(self, lo: int, hi: int, value: float) -> None:
        a = self._split(lo)
        b = self._split(hi)
        vals = self.vals
        for i in range(a, b):
            if vals[i] < value:
                vals[i] = value
        # Merge equal neighbours around the updated range so pieces stay few.
        i = max(a, 1)
        stop = min(b + 1, len(vals))
        while i < stop:
            if vals[i] == vals[i - 1]:
                del vals[i]
                del self.starts[i]
                stop -= 1
            else:
                i += 1


def _split(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    step = -(-(hi - lo) // parts)
    return [(a, min(hi, a + step)) for a in range(lo, hi, step)]


def _intervals(
    log: Sequence[Access],
    work: BlockWork,
    pieces_per_request: int,
    hold_across_gpu: bool = False,
    vllm_offers: bool = False,
    prefill_stores: bool = False,
) -> _Intervals:
    """The LP's intervals and prefix chains, and the work credited free.

    ``hold_across_gpu``, ``vllm_offers``: which uses make a block available again, and from
    when (the diagnostics of :func:`prefill_bound`); ``prefill_stores``: from the use's prefill
    end instead of its completion (the tighter bound, module docstring)."""
    held: dict[int, _Pieces] = {}
    out = _Intervals()
    for acc in log:
        # Maximal position ranges [p, q) of the eligible region with one availability time,
        # in prefix order, up to the first block no earlier request held.
        ranges: list[tuple[int, int, float]] = []
        broken = False
        pos = 0
        for seg, start, stop in acc.runs:
            segment = held.get(seg)
            if segment is None:
                segment = held[seg] = _Pieces()
            lo = start + max(0, acc.gpu_hit - pos)
            if lo < stop and not broken:
                for a, b, prev_done in segment.query(lo, stop):
                    if prev_done == -np.inf:
                        broken = True  # a block it must compute: nothing after it can hit
                        break
                    p0 = pos + a - start
                    avail = min(prev_done, acc.lookup_s)
                    if ranges and ranges[-1][1] == p0 and ranges[-1][2] == avail:
                        ranges[-1] = (ranges[-1][0], p0 + b - a, avail)
                    else:
                        ranges.append((p0, p0 + b - a, avail))
            # A use makes its blocks available again from its completion; in the diagnostic,
            # only the blocks it computed or loaded (not those its GPU hit served).
            renew, when = start, acc.done_s
            if prefill_stores and acc.first_token_s >= 0:
                when = min(when, acc.first_token_s)
            if vllm_offers:
                # vLLM offers a request's context from 0 when the tier had none of it, else
                # from past the blocks it loaded; the offers end with its prefill.
                offered = 0 if acc.host_hit == 0 else acc.gpu_hit + acc.host_hit
                renew = min(start + max(0, offered - pos), stop)
                when = acc.first_token_s if acc.first_token_s >= 0 else acc.done_s
            elif hold_across_gpu:
                renew = min(lo, stop)
            if renew < stop:
                segment.raise_to(renew, stop, when)
            pos += stop - start
        total = sum(q - p for p, q, _a in ranges)
        prev = -1
        for p, q, avail in ranges:
            if avail >= acc.lookup_s:
                out.free += work.range(p, q)  # a holder still running at the lookup
                continue
            parts = max(1, round(pieces_per_request * (q - p) / total))
            for a, b in _split(p, q, parts):
                idx = len(out.start)
                out.start.append(avail)
                out.end.append(acc.lookup_s)
                out.size.append(b - a)
                out.value.append(work.range(a, b))
                if prev >= 0:
                    out.chain.append((prev, idx))
                prev = idx
    return out


def prefill_bound(
    log: Sequence[Access],
    capacity_blocks: int | None,
    work: BlockWork,
    pieces_per_request: int = 1,
    *,
    hold_across_gpu: bool = False,
    vllm_offers: bool = False,
    prefill_stores: bool = False,
) -> Bound:
    """Upper bound on the work a ``capacity_blocks`` host tier saves on ``log`` (see module).

    ``capacity_blocks=None``: an unbounded tier (every interval is kept). Each request's
    eligible blocks are cut into about ``pieces_per_request`` LP variables chained in prefix
    order; more pieces tighten the bound (fact 3 is applied to smaller groups), never break it.

    ``hold_across_gpu=True`` is a *diagnostic*, not a bound on every policy: the LP above may
    drop a block and have it "re-stored" at a use the GPU serves (the use's completion makes it
    available again), which an online policy cannot plan without knowing the GPU's future. With
    the flag a GPU-served use does not renew a block's availability: a block that hits at a
    later GPU-missing use must have been held since the last use that computed or loaded it,
    across every GPU-served use between. The gap between the two figures is the part of the
    bound that rests on dropping and re-storing around GPU hits.

    ``vllm_offers=True``, a second diagnostic: a block becomes available only when vLLM's
    connector could have stored it in this run, i.e. when a request *offered* it (its whole
    context when the tier had none of it, else only past the blocks it loaded), and from the
    end of that request's prefill instead of its completion. The LP above credits the running
    time of every request for free (a block may be stored at its holder's completion) and lets
    a loaded block be dropped and stored again; vLLM stores during the prefill and never
    re-offers what it loaded. Both diagnostics read the run's own GPU and host hits, so they
    describe that run; neither bounds every policy.

    ``prefill_stores=True`` is a bound, not a diagnostic: blocks become available from their
    holder's prefill end (where known) instead of its completion, true of every policy in an
    engine that stores prompt blocks during the prefill (module docstring).
    """
    t0 = time.perf_counter()
    iv = _intervals(log, work, pieces_per_request, hold_across_gpu, vllm_offers, prefill_stores)
    n = len(iv.start)
    if capacity_blocks is None:
        whole = iv.free + sum(iv.value)
        return Bound(whole, iv.free, n, 0, time.perf_counter() - t0, "unbounded")
    if capacity_blocks <= 0 or n == 0:
        return Bound(iv.free, iv.free, n, 0, time.perf_counter() - t0, "trivial")
    lp, _held, m = _solve(iv, capacity_blocks)
    # HiGHS stops within a relative optimality tolerance of 1e-7: pad by more than that so the
    # reported figure stays above the true LP optimum.
    lp *= 1.0 + 1e-6
    return Bound(iv.free + lp, iv.free, n, m, time.perf_counter() - t0, "optimal")


def _solve(
    iv: _Intervals, capacity_blocks: int
) -> tuple[float, np.ndarray[Any, np.dtype[np.float64]], int]:
    """The LP's optimum over ``iv`` (unpadded), each interval's held fraction ``z`` at it, and
    the number of time points (diagnostics read ``z``: which hits the bound credits)."""
    from scipy.optimize import linprog
    from scipy.sparse import csr_array

    n = len(iv.start)
    starts = np.array(iv.start)
    ends = np.array(iv.end)
    sizes = np.array(iv.size, dtype=np.float64)
    values = np.array(iv.value)
    # A group bigger than the tier can be held at most ``capacity / size`` of itself.
    upper = np.minimum(1.0, capacity_blocks / sizes)
    times = np.unique(np.concatenate([starts, ends]))
    m = len(times)
    a_idx = np.searchsorted(times, starts)
    b_idx = np.searchsorted(times, ends)
    # Variables: z_0..z_{n-1} (fraction held), then u_0..u_{m-1} (share of the tier held over
    # [times[k], times[k+1]), at most 1). The capacity rows of FOO's interval LP, differenced
    # along the time line: u_k - u_{k-1} = sum_{i starts at k} s_i z_i - sum_{i ends at k} s_i z_i.
    s = sizes / float(capacity_blocks)
    rows = np.concatenate([a_idx, b_idx, np.arange(m), np.arange(1, m)])
    cols = np.concatenate([np.arange(n), np.arange(n), n + np.arange(m), n + np.arange(m - 1)])
    data = np.concatenate([-s, s, np.ones(m), -np.ones(m - 1)])
    a_eq = csr_array((data, (rows, cols)), shape=(m, n + m))
    # Prefix chains: z_j - z_i <= 0.
    k = len(iv.chain)
    a_ub = None
    if k:
        pairs = np.array(iv.chain, dtype=np.int64)
        a_ub = csr_array(
            (
                np.concatenate([-np.ones(k), np.ones(k)]),
                (np.concatenate([np.arange(k), np.arange(k)]), pairs.T.ravel()),
            ),
            shape=(k, n + m),
        )
    top = float(values.max())
    cost = np.concatenate([-values / top, np.zeros(m)])
    bounds = np.column_stack([np.zeros(n + m), np.concatenate([upper, np.ones(m)])])
    res = linprog(
        cost,
        A_ub=a_ub,
        b_ub=np.zeros(k) if k else None,
        A_eq=a_eq,
        b_eq=np.zeros(m),
        bounds=bounds,
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"bound LP failed: {res.message}")
    return float(-res.fun) * top, np.asarray(res.x[:n]), m


def saved_work(log: Sequence[Access], work: BlockWork) -> float:
    """The work a run's host hits saved: ``w([g, g + h))`` summed over its requests."""
    return sum(work.range(a.gpu_hit, a.gpu_hit + a.host_hit) for a in log)
