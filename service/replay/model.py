"""The in-memory trace model every loader produces and the engine model replays.

A trace is a list of sessions; a session is a list of turns (LLM calls). A turn's input is a
tuple of :class:`~tenure.service.policy.types.Run` values over *segments*: a segment is one
contiguous, append-only run of blocks whose block ``i`` always holds the same content. Block ids
from the trace are resolved into segments once, at load time, by :class:`SegmentBuilder`:

* a turn that extends its previous turn appends to the same segment;
* a turn whose block list diverges (the usual "all but the last block" rewrite of a Claude
  Code turn, or a context compaction that keeps only a short prefix) keeps the shared prefix
  and continues in a *new* segment branching off the last shared block; the old tail stays in
  the old segment, where it ages out of every cache like the orphaned blocks it is in vLLM;
* blocks shared between sessions (a sibling sub-agent's system prompt, Mooncake's common
  prompts) live in the segment of the session that first computed them.

So every context is a path through a tree of segments and every run starts at block 0 of its
segment. Policies and caches then work per run, never per block.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tenure.service.policy.types import Run

__all__ = [
    "BlockIdRun",
    "SegmentBuilder",
    "SegmentTable",
    "Session",
    "Trace",
    "Turn",
    "context_blocks",
    "rle",
    "slice_runs",
]

#: ``(first_id, count)``: the ids ``first_id .. first_id + count - 1`` in order.
BlockIdRun = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Turn:
    """One LLM call of a session."""

    #: Idle time before this call: after the session's previous call completed (for a first
    #: call: after the parent's spawning call completed, or 0 for a root session's arrival).
    gap_s: float
    #: Full input blocks in prefix order (partial tail tokens are not cacheable).
    context: tuple[Run, ...]
    input_tokens: int
    output_tokens: int
    #: The response's stop reason (``tool_use``, ``end_turn``, ... or ``unknown``).
    stop: str
    #: Blocks at the head of ``context`` that an earlier call already computed (reusable).
    seen_blocks: int
    #: The session's final call (the harness would declare ``last_turn`` on it).
    last: bool
    #: The sidecar inferred the run's end at this call (a recorded trace's ``likely_end``).
    likely_end: bool = False

    @property
    def blocks(self) -> int:
        return context_blocks(self.context)


@dataclass(frozen=True, slots=True)
class Session:
    """An agent session, or a sub-agent (a child session with a parent)."""

    id: str
    turns: tuple[Turn, ...]
    #: Index of the parent session in :attr:`Trace.sessions`, ``None`` for a root session.
    parent: int | None = None
    #: The parent's turn after whose completion this child starts (``-1``: at the parent's
    #: arrival); the child's first turn arrives ``turns[0].gap_s`` later.
    spawn_after: int = -1
    #: ``(parent_turn, gap_s)``: that parent turn waits for this child to finish, then
    #: ``gap_s`` more (the recorded hand-back time); ``None`` for a background child.
    join: tuple[int, float] | None = None


@dataclass(slots=True)
class Trace:
    """Sessions (parents before their children) and the segment table they index."""

    name: str
    block_tokens: int
    sessions: list[Session] = field(default_factory=list)
    #: Session index owning each segment.
    segment_owner: list[int] = field(default_factory=list)

    @property
    def roots(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions) if s.parent is None]

    @property
    def turn_count(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def subset(self, roots: Sequence[int]) -> Trace:
        """The trace restricted to ``roots`` and their descendants (segments renumbered)."""
        keep_roots = set(roots)
        kept: set[int] = set()
        keep: list[int] = []
        for i, s in enumerate(self.sessions):
            if (s.parent is None and i in keep_roots) or (
                s.parent is not None and s.parent in kept
            ):
                keep.append(i)
                kept.add(i)
        index = {old: new for new, old in enumerate(keep)}
        seg_map: dict[int, int] = {}
        owners: list[int] = []
        out = Trace(self.name, self.block_tokens)
        for old in keep:
            s = self.sessions[old]
            turns = []
            for t in s.turns:
                ctx = []
                for r in t.context:
                    new_seg = seg_map.get(r.seg)
                    if new_seg is None:
                        new_seg = seg_map[r.seg] = len(owners)
                        owner = self.segment_owner[r.seg]
                        # A segment first computed by a dropped session: owned by this one now.
                        owners.append(index.get(owner, index[old]))
                    ctx.append(Run(new_seg, r.start, r.stop))
                turns.append(_replace_context(t, tuple(ctx)))
            parent = None if s.parent is None else index[s.parent]
            out.sessions.append(Session(s.id, tuple(turns), parent, s.spawn_after, s.join))
        out.segment_owner = owners
        return out


def _replace_context(turn: Turn, context: tuple[Run, ...]) -> Turn:
    return Turn(
        turn.gap_s,
        context,
        turn.input_tokens,
        turn.output_tokens,
        turn.stop,
        turn.seen_blocks,
        turn.last,
        turn.likely_end,
    )


def context_blocks(runs: Iterable[Run]) -> int:
    return sum(r.stop - r.start for r in runs)


def slice_runs(runs: Sequence[Run], start: int, stop: int | None = None) -> list[Run]:
    """Blocks ``[start, stop)`` of the concatenation of ``runs``, as runs."""
    out: list[Run] = []
    pos = 0
    for seg, a, b in runs:
        n = b - a
        lo = max(start - pos, 0)
        hi = n if stop is None else min(stop - pos, n)
        if lo < hi:
            out.append(Run(seg, a + lo, a + hi))
        pos += n
        if stop is not None and pos >= stop:
            break
    return out


def rle(ids: Iterable[int]) -> list[BlockIdRun]:
    """Run-length encode consecutive ids: ``[5, 6, 7, 9]`` -> ``[(5, 3), (9, 1)]``."""
    out: list[BlockIdRun] = []
    for i in ids:
        if out and out[-1][0] + out[-1][1] == i:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((i, 1))
    return out


@dataclass(slots=True)
class SegmentTable:
    """The segments of one trace: owner session, current length and branch point of each.

    ``owners`` is the trace's :attr:`Trace.segment_owner` list itself; several builders (one per
    block-id space) share one table.
    """

    owners: list[int]
    lengths: list[int] = field(default_factory=list)
    parents: list[tuple[int, int] | None] = field(default_factory=list)


class SegmentBuilder:
    """Resolves block-id lists into segment runs for one block-id space.

    Known ids are kept as sorted, non-overlapping id intervals, each mapped to a block range of
    one segment, so resolving a turn costs per interval, not per block. Ids are trusted to be
    chained (an id implies its whole prefix, as vLLM's and Mooncake's hashes are): a known id
    reached from a different predecessor is treated as new content.
    """

    def __init__(self, table: SegmentTable) -> None:
        self._table = table
        self._starts: list[int] = []  # interval first ids, sorted
        self._intervals: list[tuple[int, int, int, int]] = []  # (first, stop, seg, index)
        self._seg_len = table.lengths
        self._seg_parent = table.parents

    def _find(self, block_id: int) -> tuple[int, int, int, int] | None:
        """The interval containing ``block_id``, or ``None``."""
        i = bisect_right(self._starts, block_id) - 1
        if i >= 0:
            iv = self._intervals[i]
            if iv[0] <= block_id < iv[1]:
                return iv
        return None

    def _next_known(self, block_id: int) -> int | None:
        i = bisect_right(self._starts, block_id)
        return self._starts[i] if i < len(self._starts) else None

    def _register(self, first: int, count: int, seg: int, index: int) -> None:
        i = bisect_right(self._starts, first)
        self._starts.insert(i, first)
        self._intervals.insert(i, (first, first + count, seg, index))

    def _new_segment(self, session: int, parent: tuple[int, int] | None) -> int:
        seg = len(self._table.owners)
        self._table.owners.append(session)
        self._seg_len.append(0)
        self._seg_parent.append(parent)
        return seg

    def resolve(self, ids: Sequence[BlockIdRun], session: int) -> tuple[tuple[Run, ...], int]:
        """Runs for the id list ``ids`` (RLE) of a call by ``session``; and its seen-prefix length.

        The seen prefix is the number of leading blocks some earlier call already computed.
        """
        runs: list[Run] = []
        pos: tuple[int, int] | None = None  # (seg, index) of the last placed block
        seen = 0
        fresh = False  # once a new block appears, everything after it is new as well
        for first, count in ids:
            block_id, left = first, count
            while left > 0:
                iv = None if fresh else self._find(block_id)
                if iv is not None:
                    seg, index = iv[2], iv[3] + block_id - iv[0]
                    predecessor = (seg, index - 1) if index > 0 else self._seg_parent[seg]
                    if predecessor == pos:
                        take = min(left, iv[1] - block_id)
                        _append(runs, seg, index, index + take)
                        pos = (seg, index + take - 1)
                        seen += take
                        block_id += take
                        left -= take
                        continue
                fresh = True
                # New content: as far as the next known id (or the end of this id run).
                nxt = self._next_known(block_id)
                take = left if nxt is None or nxt >= block_id + left else nxt - block_id
                take = max(take, 1)
                seg, index = self._place(session, pos, take)
                if self._find(block_id) is None and (nxt is None or nxt >= block_id + take):
                    self._register(block_id, take, seg, index)
                _append(runs, seg, index, index + take)
                pos = (seg, index + take - 1)
                block_id += take
                left -= take
        return tuple(runs), seen

    def _place(self, session: int, pos: tuple[int, int] | None, count: int) -> tuple[int, int]:
        """Where ``count`` new blocks following ``pos`` go: appended, or a new branch."""
        if pos is not None:
            seg, index = pos
            if index == self._seg_len[seg] - 1 and self._table.owners[seg] == session:
                self._seg_len[seg] += count
                return seg, index + 1
        seg = self._new_segment(session, pos)
        self._seg_len[seg] = count
        return seg, 0


def _append(runs: list[Run], seg: int, start: int, stop: int) -> None:
    if runs and runs[-1].seg == seg and runs[-1].stop == start:
        runs[-1] = Run(seg, runs[-1].start, stop)
    else:
        runs.append(Run(seg, start, stop))
