"""The one derivation of a spawn's parent-side facts, shared by the replay and the sidecar."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tenure.service.policy.ranker import SpawnRecord
from tenure.service.policy.spawn_context import (
    ParentCall,
    WorkerHistory,
    history_at,
    human_turn,
    input_types,
    lifetime_log,
    parent_features,
)


def test_input_types_name_what_follows_the_last_assistant_message():
    tool = {"role": "tool", "tool_call_id": "c", "content": "ok"}
    human = {"role": "user", "content": "please fix it"}
    said = {"role": "assistant", "content": "done"}
    assert input_types([human]) == ("text",)
    assert input_types([human, said, tool]) == ("tool_result",)
    assert input_types([human, said, tool, human]) == ("text", "tool_result")
    # Anthropic-style blocks, and text parts in an OpenAI content list.
    blocks = {"role": "user", "content": [{"type": "tool_result", "content": "x"}]}
    assert input_types([said, blocks]) == ("tool_result",)
    parts = {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url"}]}
    assert input_types([said, parts]) == ("text",)
    # Nothing new, blank text, junk: no kind (not a human turn).
    assert input_types([human, said]) == ()
    assert input_types([said, {"role": "user", "content": "  "}, 7, None]) == ()
    assert input_types(None) == () and input_types([]) == ()
    assert human_turn(["text", "tool_result"]) and not human_turn(["tool_result"])


def test_history_counts_a_worker_returned_at_the_spawn_instant():
    earlier = [(0.0, 10.0), (2.0, 30.0), (5.0, 1.0)]
    h = history_at(earlier, 10.0)  # the first ends exactly then, the third earlier
    assert (h.before, h.returned) == (3, 2)
    assert h.returned_mean_lifetime_s == pytest.approx(math.sqrt(10.0 * 1.0))
    assert history_at([], 5.0) == WorkerHistory()
    assert WorkerHistory(2, 0, 0.0).returned_mean_lifetime_s == 0.0
    assert lifetime_log(0.0) == math.log(1e-3)  # floored, never -inf


def test_parent_features_are_spawn_record_fields():
    call = ParentCall(index=4, prompt_tokens=1000, output_tokens=250, thinking=True,
                      human_turn=True, gap_s=12.5)  # fmt: skip
    history = WorkerHistory(3, 2, lifetime_log(40.0) + lifetime_log(90.0))
    features = parent_features(call, history)
    assert set(features) <= {f.name for f in dataclasses.fields(SpawnRecord)}
    assert features["parent_turn"] == 4 and features["parent_context_tokens"] == 1250
    assert features["parent_output_tokens"] == 250 and features["parent_gap_s"] == 12.5
    assert features["parent_thinking"] and features["parent_human_turn"]
    assert (features["workers_before"], features["workers_returned"]) == (3, 2)
    assert features["returned_mean_lifetime_s"] == pytest.approx(60.0)
    record = SpawnRecord(**features)
    assert record.values()["returned_log_lifetime"] == pytest.approx(math.log1p(60.0))
    # A parent that has made no call: zeros, as the replay has for a spawn before any call.
    none = parent_features(None, WorkerHistory())
    assert none["parent_turn"] == 0 and none["parent_context_tokens"] == 0
