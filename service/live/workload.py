"""A slice of the Claude Code trace, scaled to the tiny model, as the live A/B plays it.

**The slice.** ``sessions`` root sessions (with their sub-agents) in file order from the
``first`` one whose every kept call fits the model, each cut to its first ``max_turns`` calls
(a sub-agent is kept when it is spawned within its parent's kept calls; it is cut the same way;
the kept calls' last one is the session's declared last turn).

**The scale.** Every 64-token trace block is a fixed sequence of ``tokens_per_block`` words of
the model's vocabulary (default one), derived from the block's place in the trace's prefix tree
(:mod:`tenure.service.replay.model`: segment and index), so two calls share exactly the prefix the
trace says they share: the same appends, the same rewritten last blocks, the same compactions,
the same sub-agent prompts. A branch's first block is drawn to differ from every sibling's at
the same position, so no prefix is longer than the trace's. The partial block after a call's
last full one (under 64 tokens) scales to ``round(tail * tokens_per_block / 64)`` fresh words.
A call's prompt is one user message of those words; the chat template frames it with three
tokens before (``<s> user :``) and three after (``</s> assistant :``).

**The answers.** A call whose recorded stop reason is ``tool_use`` is answered with a real tool
call (``tool_choice="required"``: ``[{"name": "bash", "parameters": {}}]``, 3 tokens + EOS,
finish reason ``tool_calls``); every other call (``end_turn``, and the trace's empty stop reason,
99% of which a human's ``text`` input follows) with ``round(out / 64)`` words (1-8) + EOS,
finish reason ``stop``. The simulator gets the same output lengths and stop reasons.

**The clock.** Every recorded gap (tool run, human, sub-agent spawn and hand-back) is divided
by ``time_scale`` and capped at ``max_gap_s`` live seconds.

:func:`engine_trace` turns the slice into the trace the simulator replays: the engine's own
blocks (``engine_block_tokens`` of the framed prompt) with chained identities, so simulator and
engine see the same block structure token for token.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tenure.service.errors import UsageError
from tenure.service.replay.model import SegmentBuilder, SegmentTable, Session, Trace, Turn

__all__ = [
    "CHAT_PREFIX",
    "CHAT_SUFFIX",
    "TOOL_CALL_TOKENS",
    "LiveSession",
    "LiveTurn",
    "ScaleError",
    "SliceSpec",
    "Workload",
    "arrival_schedule",
    "build_workload",
    "engine_trace",
]

#: What the tiny model's chat template puts around one user message (see its generator).
CHAT_PREFIX = ("<s>", "user", ":")
CHAT_SUFFIX = ("</s>", "assistant", ":")
#: ``[{"name":`` ``"bash"`` ``,"parameters":{}}]`` plus EOS (the tiny model's JSON tokens).
TOOL_CALL_TOKENS = 4
#: Words of an end-of-turn answer: at least one, at most this many.
MAX_ANSWER_WORDS = 8
_TOOL_STOP = "tool_use"


class ScaleError(UsageError):
    """The trace (or the slice asked for) cannot be scaled to the model: one line, exit 2."""


@dataclass(frozen=True, slots=True)
class SliceSpec:
    trace: Path
    sessions: int = 16
    first: int = 0
    max_turns: int = 24
    #: Trace seconds per live second.
    time_scale: float = 20.0
    #: Cap of any one gap, in live seconds.
    max_gap_s: float = 30.0
    tokens_per_block: int = 1
    #: Longest framed prompt a kept call may have (the engine's max_model_len minus room to
    #: answer).
    max_prompt_tokens: int = 3000
    #: Vocabulary words to draw from (the tiny model's ``w0 .. w<n-1>``).
    words: int = 2041

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ScaleError("the slice needs at least one session")
        if self.first < 0:
            raise ScaleError("--first must be >= 0")
        if self.max_turns < 1:
            raise ScaleError("--max-turns must be >= 1")
        if not (self.time_scale > 0 and math.isfinite(self.time_scale)):
            raise ScaleError("--time-scale must be a positive number")
        if not (self.max_gap_s > 0 and math.isfinite(self.max_gap_s)):
            raise ScaleError("--max-gap-s must be a positive number")
        if self.tokens_per_block < 1:
            raise ScaleError("tokens per trace block must be >= 1")


@dataclass(frozen=True, slots=True)
class LiveTurn:
    gap_s: float
    #: Word indices of the message (``w<i>``), the whole prompt minus the chat framing.
    words: tuple[int, ...]
    tool: bool
    answer_words: int
    last: bool

    @property
    def prompt_tokens(self) -> int:
        return len(CHAT_PREFIX) + len(self.words) + len(CHAT_SUFFIX)

    @property
    def output_tokens(self) -> int:
        return TOOL_CALL_TOKENS if self.tool else self.answer_words + 1

    @property
    def stop(self) -> str:
        """The finish reason the engine's answer carries."""
        return "tool_calls" if self.tool else "stop"

    def text(self) -> str:
        return " ".join(f"w{i}" for i in self.words)


@dataclass(frozen=True, slots=True)
class LiveSession:
    id: str
    #: The trace's own id (``trace_id/agent`` for a sub-agent), for the record.
    source: str
    turns: tuple[LiveTurn, ...]
    parent: int | None = None
    spawn_after: int = -1
    join: tuple[int, float] | None = None


@dataclass(slots=True)
class Workload:
    spec: SliceSpec
    sessions: list[LiveSession] = field(default_factory=list)
    #: Root sessions of the trace passed over because a kept call does not fit the model.
    skipped_too_long: int = 0

    @property
    def roots(self) -> list[int]:
        return [i for i, s in enumerate(self.sessions) if s.parent is None]

    @property
    def turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def describe(self) -> str:
        spec = self.spec
        return (
            f"{len(self.roots)} Claude Code sessions (+{len(self.sessions) - len(self.roots)} "
            f"sub-agents), {self.turns} calls: first {spec.max_turns} calls each, one trace "
            f"block = {spec.tokens_per_block} token, gaps / {spec.time_scale:g} "
            f"(capped at {spec.max_gap_s:g} s)"
        )


def _mix(*values: int) -> int:
    """A 64-bit mix of integers (splitmix64 steps): deterministic across runs and platforms."""
    x = 0x9E3779B97F4A7C15
    for v in values:
        x = (x ^ (v & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 29
    return x


class _Tokens:
    """The fixed words of every block ``(segment, index)`` of one trace."""

    def __init__(self, words: int, per_block: int) -> None:
        self.words = words
        self.per_block = per_block
        self._cache: dict[tuple[int, int], tuple[int, ...]] = {}
        #: Branch point ``(parent segment, index)`` -> first words already taken after it.
        self._after: dict[tuple[int, int] | None, set[tuple[int, ...]]] = {}

    def _draw(self, seg: int, index: int, salt: int = 0) -> tuple[int, ...]:
        return tuple(_mix(seg, index, j, salt) % self.words for j in range(self.per_block))

    def block(self, seg: int, index: int, parent: tuple[int, int] | None) -> tuple[int, ...]:
        got = self._cache.get((seg, index))
        if got is not None:
            return got
        if index == 0:
            # A branch: its first block must differ from every other continuation of the same
            # prefix (the parent segment's own next block and earlier sibling branches).
            # Contexts with no shared prefix at all (parent None) share no engine block anyway
            # (the first 32 tokens would all have to agree), so a bounded search suffices.
            taken = self._after.setdefault(parent, set())
            if parent is not None:
                taken.add(self.block(parent[0], parent[1] + 1, None))
            got = self._draw(seg, 0)
            for salt in range(1, 64):
                if got not in taken:
                    break
                got = self._draw(seg, 0, salt)
            taken.add(got)
        else:
            got = self._draw(seg, index)
        self._cache[(seg, index)] = got
        return got


def _keep(trace: Trace, root: int, max_turns: int) -> list[tuple[int, Session]]:
    """``root`` and its kept descendants, cut to ``max_turns`` calls each (trace order)."""
    kept: dict[int, int] = {}  # trace index -> kept turns
    out: list[tuple[int, Session]] = []
    for i in range(root, len(trace.sessions)):
        s = trace.sessions[i]
        if i == root:
            n = min(max_turns, len(s.turns))
        elif s.parent is not None and s.parent in kept:
            if s.spawn_after >= kept[s.parent]:
                continue
            n = min(max_turns, len(s.turns))
        else:
            if s.parent is None:
                break  # the next root session
            continue
        kept[i] = n
        out.append((i, s))
    return out


def build_workload(trace: Trace, spec: SliceSpec) -> Workload:
    """The slice of ``trace`` (a loaded Claude Code trace) that ``spec`` describes."""
    if trace.block_tokens <= 0:
        raise ScaleError(f"{spec.trace}: the trace has no block size")
    tokens = _Tokens(spec.words, spec.tokens_per_block)
    parents = _segment_parents(trace)
    work = Workload(spec)
    scale = spec.tokens_per_block / trace.block_tokens
    frame = len(CHAT_PREFIX) + len(CHAT_SUFFIX)
    for root in trace.roots[spec.first :]:
        if len(work.roots) == spec.sessions:
            break
        group = _keep(trace, root, spec.max_turns)
        fits = all(
            frame + t.blocks * spec.tokens_per_block + _tail(t, trace.block_tokens, scale)
            <= spec.max_prompt_tokens
            for _i, s in group
            for t in s.turns[: spec.max_turns]
        )
        if not fits:
            work.skipped_too_long += 1
            continue
        _add_group(work, trace, group, tokens, parents, scale, spec)
    if len(work.roots) < spec.sessions:
        raise ScaleError(
            f"{spec.trace}: only {len(work.roots)} of the {spec.sessions} sessions asked for "
            f"(from session {spec.first} on) fit the model: {work.skipped_too_long} have a call "
            f"longer than {spec.max_prompt_tokens} tokens at {spec.tokens_per_block} token(s) "
            "per trace block"
        )
    return work


def _tail(turn: Turn, block_tokens: int, scale: float) -> int:
    return round(max(0, turn.input_tokens - turn.blocks * block_tokens) * scale)


def _segment_parents(trace: Trace) -> dict[int, tuple[int, int] | None]:
    """Each segment's branch point ``(segment, index)`` (``None``: a context's first run)."""
    parents: dict[int, tuple[int, int] | None] = {}
    for s in trace.sessions:
        for t in s.turns:
            prev: tuple[int, int] | None = None
            for run in t.context:
                if run.seg not in parents and run.start == 0:
                    parents[run.seg] = prev
                prev = (run.seg, run.stop - 1)
    return parents


def _add_group(
    work: Workload,
    trace: Trace,
    group: Sequence[tuple[int, Session]],
    tokens: _Tokens,
    parents: dict[int, tuple[int, int] | None],
    scale: float,
    spec: SliceSpec,
) -> None:
    index_of: dict[int, int] = {}
    root_no = len(work.roots)
    for trace_index, s in group:
        turns = s.turns[: spec.max_turns]
        live_turns: list[LiveTurn] = []
        for k, t in enumerate(turns):
            words: list[int] = []
            for run in t.context:
                for b in range(run.start, run.stop):
                    words.extend(tokens.block(run.seg, b, parents.get(run.seg)))
            for j in range(_tail(t, trace.block_tokens, scale)):
                words.append(_mix(trace_index, k, j, 0x7A11) % spec.words)
            tool = t.stop == _TOOL_STOP
            answer = min(MAX_ANSWER_WORDS, max(1, round(t.output_tokens * scale)))
            live_turns.append(
                LiveTurn(
                    gap_s=min(t.gap_s / spec.time_scale, spec.max_gap_s),
                    words=tuple(words),
                    tool=tool,
                    answer_words=answer,
                    last=k == len(turns) - 1,
                )
            )
        parent = None if s.parent is None else index_of[s.parent]
        join = None
        if s.join is not None and parent is not None:
            parent_turns = len(work.sessions[parent].turns)
            if s.join[0] < parent_turns:
                join = (s.join[0], min(s.join[1] / spec.time_scale, spec.max_gap_s))
        sid = f"s{root_no}" if parent is None else f"{work.sessions[parent].id}.a{len(index_of)}"
        index_of[trace_index] = len(work.sessions)
        work.sessions.append(LiveSession(sid, s.id, tuple(live_turns), parent, s.spawn_after, join))


def engine_trace(work: Workload, engine_block_tokens: int) -> Trace:
    """The slice as the engine sees it: framed prompts in ``engine_block_tokens`` blocks.

    Block identity is chained (a block stands for its whole prefix), as vLLM's prefix hashes
    are, so sharing is exactly the engine's.
    """
    trace = Trace(name=f"live-slice({work.describe()})", block_tokens=engine_block_tokens)
    table = SegmentTable(trace.segment_owner)
    builder = SegmentBuilder(table)
    ids: dict[tuple[int, tuple[str | int, ...]], int] = {}
    for index, s in enumerate(work.sessions):
        turns: list[Turn] = []
        for t in s.turns:
            prompt: list[str | int] = [*CHAT_PREFIX, *t.words, *CHAT_SUFFIX]
            chain = 0
            block_ids: list[tuple[int, int]] = []
            bt = engine_block_tokens
            for b in range(len(prompt) // bt):
                key = (chain, tuple(prompt[b * bt : (b + 1) * bt]))
                chain = ids.setdefault(key, len(ids) + 1)
                if block_ids and block_ids[-1][0] + block_ids[-1][1] == chain:
                    block_ids[-1] = (block_ids[-1][0], block_ids[-1][1] + 1)
                else:
                    block_ids.append((chain, 1))
            context, seen = builder.resolve(block_ids, index)
            turns.append(Turn(t.gap_s, context, len(prompt), t.output_tokens, t.stop, seen, t.last))
        trace.sessions.append(Session(s.id, tuple(turns), s.parent, s.spawn_after, s.join))
    return trace


def arrival_schedule(roots: Sequence[int], rate: float, seed: int) -> list[tuple[float, int]]:
    """``(time, root)`` of every root session: the simulator's own schedule for ``seed``.

    The same seeded shuffle and Poisson clock as :func:`tenure.service.replay.engine.simulate` (a
    test holds the two together), so the live arms and the simulated ones share their arrivals.
    """
    rng = random.Random(seed)
    order = list(roots)
    rng.shuffle(order)
    clock = 0.0
    out = []
    for root in order:
        clock += rng.expovariate(rate)
        out.append((clock, root))
    return out
