"""The recording's export: canonical lines the replay loads, prefix structure kept, no text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tenure.service.record.canonical import to_canonical
from tenure.service.record.events import (
    RecordedTurn,
    hashed_session,
    prefix_chunks,
    request_bytes,
)
from tenure.service.replay.loaders.canonical import load_canonical

CHUNK = 32


def _turn(
    session: str, k: int, text: str, at: float, tokens: int, *, parent: str | None = None,
    stop: str = "tool_calls", last: bool = False,
) -> RecordedTurn:  # fmt: skip
    data = request_bytes("m", [{"role": "user", "content": text}])
    return RecordedTurn(
        session=session, turn=k, arrival_s=at, end_s=at + 0.5,
        chunks=prefix_chunks(data, CHUNK), request_bytes=len(data), prompt_tokens=tokens,
        completion_tokens=4, stop=stop, parent=parent, last_turn=last, chunk_bytes=CHUNK,
    )  # fmt: skip


def _write(tmp_path: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp_path / "rec.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_sessions_turns_tokens_and_gaps_round_trip(tmp_path: Path) -> None:
    base = " ".join(f"w{i}" for i in range(400))
    events = [
        _turn("a", 1, base, 100.0, 400),
        _turn("a", 2, base + " w9 w8 w7", 101.5, 403),
        _turn("b", 1, "x " * 50, 100.2, 50, parent="a", stop="stop", last=True),
        _turn("a", 3, base + " w9 w8 w7 w1 w2", 103.0, 405, stop="stop", last=True),
    ]
    lines, summary = to_canonical(events, block_tokens=16)
    assert lines[0]["format"] == "tenure-sessions" and lines[0]["id_scope"] == "global"
    assert summary.sessions == 2 and summary.turns == 4
    trace = load_canonical(_write(tmp_path, lines))
    a, b = trace.sessions
    assert [t.input_tokens for t in a.turns] == [400, 403, 405]
    assert [t.output_tokens for t in a.turns] == [4, 4, 4]
    assert a.turns[1].gap_s == 1.0 and a.turns[2].gap_s == 1.0
    assert b.parent == 0 and b.spawn_after == -1  # no parent turn had ended yet
    # The appended turns reuse every block inside the bytes they share with the one before.
    assert a.turns[1].seen_blocks >= 400 // 16 - 2
    assert a.turns[2].seen_blocks >= a.turns[1].blocks - 1
    # A different prompt shares nothing.
    assert b.turns[0].seen_blocks == 0
    assert lines[1]["turns"][2]["hints"] == {"last_turn": True}


def test_a_rewritten_tail_shares_only_the_common_prefix(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(600)]
    first = " ".join(words)
    compacted = " ".join(words[:200] + [f"z{i}" for i in range(50)])
    events = [_turn("s", 1, first, 0.0, 600), _turn("s", 2, compacted, 2.0, 250)]
    lines, _ = to_canonical(events, block_tokens=16)
    trace = load_canonical(_write(tmp_path, lines))
    t = trace.sessions[0].turns[1]
    # About 200 of 600 tokens shared (the bytes-to-tokens split is proportional).
    assert 8 <= t.seen_blocks <= 200 // 16 + 1
    assert t.blocks == 250 // 16


def test_no_text_and_session_ids_hashed_per_tenant() -> None:
    key = b"k" * 32
    assert hashed_session(key, "acme", "s1") != hashed_session(key, "other", "s1")
    assert hashed_session(key, "acme", "s1") != hashed_session(b"j" * 32, "acme", "s1")
    secret = "the password is hunter2"
    event = _turn(hashed_session(key, "acme", "s1"), 1, secret, 0.0, 10)
    lines, _ = to_canonical([event], block_tokens=4)
    dumped = json.dumps(lines)
    assert "hunter2" not in dumped and "s1" not in dumped and "acme" not in dumped


def test_missing_usage_is_estimated_and_said() -> None:
    event = _turn("s", 1, "w " * 100, 0.0, 0)
    event.prompt_tokens = None
    lines, summary = to_canonical([event], block_tokens=16)
    assert summary.estimated_token_turns == 1 and lines[0]["estimated_token_turns"] == 1
    assert lines[1]["turns"][0]["input_tokens"] > 0
