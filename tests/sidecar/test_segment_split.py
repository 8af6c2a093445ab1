"""The segment splitter on its own (pure): bounds, rewritten histories, unknown boundaries, the
state codec, and what it makes of responses and streams."""

from __future__ import annotations

import json

import pytest

from tenure.service.api.segments.facts import (
    ResponseFacts,
    StreamFacts,
    carried_reasoning,
    reasoning_digest,
    response_facts,
)
from tenure.service.api.segments.split import split_turn
from tenure.service.api.segments.state import MAX_SPANS, SegmentState, Span, StateDecodeError
from tenure.service.policy.segments import SegmentClass, SessionRole
from tenure.service.wire.segments import parse_segment_tags

R = SegmentClass.REASONING


def facts(
    prompt: int, reasoning: str | None = "think hard", content: str = "answer"
) -> ResponseFacts:
    return ResponseFacts(prompt, 20, 10 if reasoning else None, reasoning_digest(reasoning),
                         len(reasoning or ""), len(content))  # fmt: skip


def test_a_carried_tool_loop_never_declares_more_than_the_wire_allows():
    state = SegmentState()
    messages: list[dict[str, str]] = [{"role": "user", "content": "go"}]
    prompt = 50
    for turn in range(1, 200):
        split = split_turn(state, messages, turn, reasoning_expected=True, prompt_tokens=prompt)
        parse_segment_tags({"segments": split.wire()})  # valid for the engine, every turn
        assert len(split.spans) <= MAX_SPANS
        text = f"thought {turn}"
        messages = [*messages, {"role": "assistant", "content": "ok", "reasoning": text},
                    {"role": "user", "content": "more"}]  # fmt: skip
        state.turn, state.messages, state.spans = turn, len(messages) - 2, list(split.spans)
        state.gen_id, state.gen_start = (split.gen.id if split.gen else None), prompt
        state.facts = facts(prompt, text)
        prompt += 40
    # The oldest carried reasoning was folded into carried output, the newest stay reasoning.
    reasoning = [s for s in split.spans if s.cls is R]
    assert len(reasoning) >= MAX_SPANS // 2 - 2 and reasoning[-1].id == "t198.r"
    assert split.spans[1].cls is SegmentClass.OUTPUT


def test_a_rewritten_history_starts_over_and_unknown_boundaries_add_nothing():
    state = SegmentState(turn=3, messages=4, spans=[Span("ctx", SegmentClass.LEAD, 0),
                         Span("t2.out", SegmentClass.OUTPUT, 80)], facts=facts(120))  # fmt: skip
    shorter = [{"role": "user", "content": "new task"}]
    split = split_turn(state, shorter, 4, reasoning_expected=False, prompt_tokens=None)
    assert split.verdict == "rewritten" and [s.id for s in split.spans] == ["ctx"]
    longer = [*([{"role": "user", "content": "x"}] * 4), {"role": "assistant", "content": "y"}]
    unknown = SegmentState(turn=3, messages=4, spans=state.spans, facts=None)
    split = split_turn(unknown, longer, 4, reasoning_expected=False, prompt_tokens=None)
    assert split.verdict == "unknown" and split.spans == tuple(state.spans)


def test_lower_bound_start_without_a_prompt_count_and_worker_classes():
    state = SegmentState(role=SessionRole.WORKER, parent="L", turn=1, messages=1,
                         gen_start=100, facts=facts(100))  # fmt: skip
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "b"}]  # fmt: skip
    split = split_turn(state, msgs, 2, reasoning_expected=True, prompt_tokens=None)
    assert split.verdict == "stripped" and not split.exact_start
    # A worker's carried output is its own class: one span with its context.
    assert [(s.id, s.cls.value, s.start) for s in split.spans] == [("ctx", "worker", 0)]
    # The stripped answer is 20 - 12 tokens long: the generation starts no earlier than that.
    assert split.gen is not None and split.gen.start == 100 + (20 - 12) - 2


def test_state_codec_round_trips_and_refuses_garbage():
    state = SegmentState(role=SessionRole.REVIEWER, parent="p", predicted_lifetime_s=12.5,
                         expected_tokens=300, model="m", turn=2, messages=3, gen_id="t2.r",
                         gen_start=90, spans=[Span("ctx", SegmentClass.REVIEWER, 0),
                         Span("t1.r", R, 40, 1, "abc")], facts=facts(90))  # fmt: skip
    assert SegmentState.from_json(state.to_json()) == state
    for bad in (b"{", b'{"role": "boss"}', b'{"spans": [["x", "nope", 0, -1, ""]]}'):
        with pytest.raises(StateDecodeError):
            SegmentState.from_json(bad)


def test_reasoning_found_in_fields_inline_and_streams():
    assert carried_reasoning({"role": "assistant", "reasoning_content": "hmm"}) == "hmm"
    assert carried_reasoning({"content": "<think> step 1 </think> done"}) == " step 1 "
    assert carried_reasoning({"content": "no thinking"}) is None
    assert reasoning_digest("a  b\nc") == reasoning_digest("a b c")
    body = {"choices": [{"message": {"content": "x y", "reasoning": "r s t"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 9,
                      "completion_tokens_details": {"reasoning_tokens": 3}}}  # fmt: skip
    got = response_facts(json.dumps(body).encode())
    assert got == ResponseFacts(7, 9, 3, reasoning_digest("r s t"), 5, 3)
    assert got.reasoning_length() == 5  # 3 + the two markers
    assert response_facts(b"not json") is None
    stream = StreamFacts()
    chunks = [{"choices": [{"delta": {"reasoning": "r s"}}]},
              {"choices": [{"delta": {"reasoning": " t"}}]},
              {"choices": [{"delta": {"content": "x y"}}]},
              {"choices": [], "usage": body["usage"]}]  # fmt: skip
    raw = (
        b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    )
    for i in range(0, len(raw), 7):  # split anywhere, as a socket does
        stream.feed(raw[i : i + 7])
    assert stream.facts() == got
