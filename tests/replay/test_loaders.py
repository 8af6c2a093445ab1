"""Loaders on the real bundled traces, and their errors on malformed files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tenure.service.replay.loaders import TraceError, load_trace, write_canonical
from tenure.service.replay.model import Trace


def _is_path(trace: Trace) -> bool:
    return all(r.start == 0 for s in trace.sessions for t in s.turns for r in t.context)


def test_claude_code_counts(claude: Trace) -> None:
    """Every session and call of the README's trace is there: 506 sessions, 41 sub-agents."""
    roots = [s for s in claude.sessions if s.parent is None]
    children = [s for s in claude.sessions if s.parent is not None]
    assert len(roots) == 506
    assert len(children) == 41
    assert claude.block_tokens == 64
    assert claude.turn_count == 34539 + 468  # main-chain calls + sub-agent calls
    assert all(s.turns[-1].last and not any(t.last for t in s.turns[:-1]) for s in claude.sessions)


def test_claude_code_hash_runs_expand(claude: Trace) -> None:
    """``hash_runs`` [[1, 155], [3789, 1163]] is 1318 blocks; the next call shares 1317."""
    first = claude.sessions[0]
    assert first.id == "trace_0004"
    assert first.turns[0].blocks == 155 + 1163
    assert first.turns[0].input_tokens == 84352 and first.turns[0].stop == "tool_use"
    assert first.turns[1].seen_blocks == 1317  # all but the rewritten last block
    assert first.turns[1].gap_s == 35.0  # think_time
    assert _is_path(claude)


def test_claude_code_subagents_are_child_sessions(claude: Trace) -> None:
    """A sub-agent is a child with its own inner times, spawned after a parent call."""
    children = [s for s in claude.sessions if s.parent is not None]
    for child in children:
        parent = claude.sessions[child.parent]  # type: ignore[index]
        assert child.id.startswith(parent.id + "/")
        assert -1 <= child.spawn_after < len(parent.turns)
        assert child.turns[0].gap_s >= 0
        if child.join is not None:
            assert child.join[0] > child.spawn_after
    joined = [c for c in children if c.join is not None]
    assert joined, "some parent call waits for its sub-agent in the recording"
    # Sub-agents never share blocks with their parent, but siblings share their prompt.
    child = next(c for c in children if c.id == "trace_0004/agent_001")
    assert child.turns[1].gap_s == 3.0


def test_claude_code_subagents_start_when_spawned_not_when_they_returned(claude: Trace) -> None:
    """A sub-agent entry's ``t`` is when it returned: trace_0010's first one (t 100.7 s,
    91.2 s long) was spawned 0.6 s after the parent call before it ended, not 91.8 s after,
    and the parent's next call waits for it (the recording shows it did)."""
    by_id = {s.id: s for s in claude.sessions}
    children = [s for s in claude.sessions if s.id.startswith("trace_0010/")]
    assert len(children) == 4
    first = min(children, key=lambda c: (c.spawn_after, c.turns[0].gap_s))
    assert first.turns[0].gap_s == pytest.approx(0.6, abs=0.05)
    assert first.join is not None and first.join[0] == first.spawn_after + 1
    # Over the trace: every finished sub-agent starts within about a second of the parent
    # call it follows, except trace_0004's two (a session resumed after a long idle).
    late = [c.id for c in claude.sessions if c.parent is not None and c.turns[0].gap_s > 1.5]
    assert late == ["trace_0004/agent_001", "trace_0004/agent_002"]
    assert by_id["trace_0004/agent_001"].turns[0].gap_s > 100_000
    joined = [c for c in claude.sessions if c.parent is not None and c.join is not None]
    assert len(joined) == 35  # of 41: the others are background agents or never waited for


def test_claude_code_compaction_starts_a_new_segment(claude: Trace) -> None:
    """A call that keeps less than half of the previous context continues on a new segment."""
    found = 0
    for s in claude.sessions:
        for prev, turn in zip(s.turns, s.turns[1:], strict=False):
            if turn.seen_blocks < prev.blocks / 2:
                found += 1
                kept = {r.seg for r in prev.context}
                new = [r for r in turn.context if r.seg not in kept]
                assert new, "the new tail lives in a segment the previous call did not use"
    assert found >= 100  # README: ~2% of turns are compactions


def test_mooncake_sessions_by_prefix(mooncake_path: Path) -> None:
    trace = load_trace(mooncake_path)
    assert trace.block_tokens == 512
    assert trace.turn_count == 3993
    multi = [s for s in trace.sessions if len(s.turns) > 1]
    assert 100 < len(multi) < len(trace.sessions) < 3993
    with gzip.open(mooncake_path, "rt") as handle:
        rows = [json.loads(line) for line in handle]
    full_blocks = sorted(r["input_length"] // 512 for r in rows)
    assert sorted(t.blocks for s in trace.sessions for t in s.turns) == full_blocks
    for s in multi:
        for prev, turn in zip(s.turns, s.turns[1:], strict=False):
            assert turn.seen_blocks >= prev.blocks  # a continuation extends the whole list
    assert _is_path(trace)


def test_canonical_round_trip(claude: Trace, tmp_path: Path) -> None:
    """Writing the canonical format and loading it back gives the same sessions and segments."""
    small = claude.subset(claude.roots[:30])
    path = tmp_path / "sessions.jsonl"
    write_canonical(small, path)
    again = load_trace(path)
    assert again.sessions == small.sessions
    assert again.segment_owner == small.segment_owner


def _gz(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt") as out:
        out.write("\n".join(lines) + "\n")
    return path


def test_truncated_gzip_names_file_and_line(claude_path: Path, tmp_path: Path) -> None:
    data = claude_path.read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(TraceError) as err:
        load_trace(cut, "claude-code")
    message = str(err.value)
    assert str(cut) in message and "truncated" in message
    assert "\n" not in message


def test_malformed_json_line(tmp_path: Path) -> None:
    good = json.dumps({"id": "s", "block_size": 64, "requests": []})
    path = _gz(tmp_path / "bad.jsonl.gz", [good, "{not json"])
    with pytest.raises(TraceError, match=r"bad\.jsonl\.gz:2: malformed JSON"):
        load_trace(path, "claude-code")


def test_missing_field_and_bad_types(tmp_path: Path) -> None:
    req = {"t": 0, "type": "n", "in": 10, "out": 1, "hash_runs": [[1, "x"]]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"id": "s", "block_size": 64, "requests": [req]}) + "\n")
    with pytest.raises(TraceError, match=r"t\.jsonl:1 request 0: bad hash_runs entry"):
        load_trace(path, "claude-code")
    path.write_text(json.dumps({"id": "s", "requests": []}) + "\n")
    with pytest.raises(TraceError, match="missing field 'block_size'"):
        load_trace(path, "claude-code")
    path.write_text(
        json.dumps({"timestamp": 0, "input_length": -1, "output_length": 1, "hash_ids": []}) + "\n"
    )
    with pytest.raises(TraceError, match="negative"):
        load_trace(path, "mooncake")


def test_canonical_header_is_required(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"id": "s", "turns": []}) + "\n")
    with pytest.raises(TraceError, match="header"):
        load_trace(path, "canonical")
    path.write_text(
        json.dumps({"format": "tenure-sessions", "version": 1, "block_tokens": 16})
        + "\n"
        + json.dumps({"id": "a", "parent": "nobody", "turns": []})
        + "\n"
    )
    with pytest.raises(TraceError, match=r"c\.jsonl:2: parent 'nobody'"):
        load_trace(path)
