"""A recording as a ``tenure-sessions`` trace (``service/replay/FORMAT.md``).

**Sessions and the clock.** Each recorded session is one line, its turns in the sidecar's turn
order. A turn's ``gap_s`` is its arrival minus the previous turn's end (the closed loop the
replay runs); a sub-agent (a session whose requests named a parent) starts after the last
parent turn that had ended when its first request came (``spawn_after_turn``), ``gap_s`` after
that turn's end. Arrival times are kept as ``arrival_s`` (seconds since the recording's first
request; the replay draws its own Poisson arrivals and ignores them).

**Blocks from bytes.** The recording has no tokens, only chained hashes of request pieces
(:mod:`tenure.service.record.events`) and each call's prompt token count. Every piece is given a
fixed token extent the first time any turn carries it: a turn's pieces already known keep
theirs, and the tokens the turn has beyond them are spread over its new pieces in proportion to
their bytes. A ``block_tokens`` block of a turn is then named by the piece its last token falls
in (and its index), so two calls share exactly the blocks inside the bytes they share, and a
block stands for its whole prefix, as the format's chained ids require.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tenure.service.record.events import RecordedTurn

__all__ = ["BYTES_PER_TOKEN_GUESS", "ExportSummary", "to_canonical"]

#: Tokens of a call whose answer carried no usage are estimated from its bytes (said in the
#: header's ``estimated_token_turns``).
BYTES_PER_TOKEN_GUESS = 4.0


@dataclass
class ExportSummary:
    sessions: int = 0
    turns: int = 0
    estimated_token_turns: int = 0
    orphans: int = 0  # sub-agents whose parent was not recorded (exported as roots)


@dataclass
class _Blocks:
    block_tokens: int
    ends: dict[int, int] = field(default_factory=dict)  # piece hash -> token end offset
    ids: dict[tuple[int | None, int, int], int] = field(default_factory=dict)

    def of(self, turn: RecordedTurn, prompt: int, salt: int) -> list[list[int]]:
        chunks = turn.chunks
        size = turn.chunk_bytes
        sizes = [size] * len(chunks)
        if chunks:
            sizes[-1] = max(1, min(size, turn.request_bytes - size * (len(chunks) - 1)))
        known = 0
        while known < len(chunks) and chunks[known] in self.ends:
            known += 1
        base = self.ends[chunks[known - 1]] if known else 0
        rest_tokens = max(0, prompt - base)
        rest_bytes = max(1, turn.request_bytes - sum(sizes[:known]))
        ends: list[int] = [self.ends[c] for c in chunks[:known]]
        run = 0
        for i in range(known, len(chunks)):
            run += sizes[i]
            share = rest_tokens * min(run, rest_bytes) // rest_bytes
            end = max(ends[-1] if ends else 0, base + share)
            self.ends.setdefault(chunks[i], end)
            ends.append(self.ends[chunks[i]])
        out: list[list[int]] = []
        for j in range(prompt // self.block_tokens):
            last = (j + 1) * self.block_tokens
            at = bisect.bisect_left(ends, last)
            # Past the hashed pieces (a prompt longer than the recorder keeps): this call's own.
            key = (chunks[at], j, 0) if at < len(chunks) else (None, j, salt)
            bid = self.ids.setdefault(key, len(self.ids) + 1)
            if out and out[-1][0] + out[-1][1] == bid:
                out[-1][1] += 1
            else:
                out.append([bid, 1])
        return out


def to_canonical(
    events: Iterable[RecordedTurn], *, block_tokens: int
) -> tuple[list[dict[str, Any]], ExportSummary]:
    """The header line and one line per session, in an order the loader accepts."""
    if block_tokens < 1:
        raise ValueError("block_tokens must be >= 1")
    by_session: dict[str, list[RecordedTurn]] = {}
    for event in events:
        by_session.setdefault(event.session, []).append(event)
    for turns in by_session.values():
        turns.sort(key=lambda t: (t.turn, t.arrival_s))
    order = sorted(by_session, key=lambda s: by_session[s][0].arrival_s)
    t0 = min((by_session[s][0].arrival_s for s in order), default=0.0)
    blocks = _Blocks(block_tokens)
    summary = ExportSummary()
    lines: list[dict[str, Any]] = []
    written: set[str] = set()
    for sid in _parents_first(order, by_session):
        turns = by_session[sid]
        line: dict[str, Any] = {"id": sid}
        parent = turns[0].parent
        first_gap = 0.0
        if parent is not None and parent in written:
            ptturns = by_session[parent]
            arrived = turns[0].arrival_s
            done = [k for k, t in enumerate(ptturns) if t.end_s <= arrived]
            after = done[-1] if done else -1
            line.update(parent=parent, spawn_after_turn=after)
            ref = ptturns[after].end_s if after >= 0 else ptturns[0].arrival_s
            first_gap = max(0.0, arrived - ref)
        elif parent is not None:
            summary.orphans += 1
        out_turns = []
        for k, t in enumerate(turns):
            prompt = t.prompt_tokens
            if prompt is None:
                summary.estimated_token_turns += 1
                prompt = round(t.request_bytes / BYTES_PER_TOKEN_GUESS)
            gap = first_gap if k == 0 else max(0.0, t.arrival_s - turns[k - 1].end_s)
            entry: dict[str, Any] = {
                "gap_s": round(gap, 6),
                "blocks": blocks.of(t, prompt, salt=summary.turns + 1),
                "input_tokens": prompt,
                "output_tokens": t.completion_tokens or 0,
                "stop": t.stop or "unknown",
                "arrival_s": round(t.arrival_s - t0, 6),
            }
            hints: dict[str, Any] = {}
            if t.last_turn:
                hints["last_turn"] = True
            if t.expected_gap_s is not None:
                hints["expected_gap_s"] = t.expected_gap_s
            if t.likely_end:
                hints["likely_end"] = True
            if hints:
                entry["hints"] = hints
            out_turns.append(entry)
            summary.turns += 1
        line["turns"] = out_turns
        lines.append(line)
        written.add(sid)
        summary.sessions += 1
    header = {
        "format": "tenure-sessions",
        "version": 1,
        "block_tokens": block_tokens,
        "id_scope": "global",
        "source": "tenure record",
        "estimated_token_turns": summary.estimated_token_turns,
    }
    return [header, *lines], summary


def _parents_first(order: list[str], by_session: dict[str, list[RecordedTurn]]) -> Iterator[str]:
    """``order`` with every recorded parent before its children (the loader's rule)."""
    done: set[str] = set()

    def visit(sid: str, depth: int) -> Iterator[str]:
        if sid in done:
            return
        parent = by_session[sid][0].parent
        if parent is not None and parent in by_session and depth < 64:
            yield from visit(parent, depth + 1)
        if sid not in done:
            done.add(sid)
            yield sid

    for sid in order:
        yield from visit(sid, 0)
