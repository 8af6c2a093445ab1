"""The sidecar's side of the spawn facts: ``SpawnFacts`` / ``predict`` carry every extended
fact into the ranker's record, the segment state keeps the parent's call, and a base artefact
predicts exactly as before whatever the extended facts say."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tenure.service.api.segments.facts import ResponseFacts
from tenure.service.api.segments.spawns import SpawnFacts, load_ranker, predict
from tenure.service.api.segments.state import SegmentState
from tenure.service.policy.ranker import (
    EXTENDED_FEATURES,
    NUMERIC_FEATURES,
    RidgeRanker,
    SpawnRecord,
)
from tenure.service.policy.ranker_fit import LabeledSpawn, fit_ridge
from tenure.service.policy.spawn_context import (
    ParentCall,
    WorkerHistory,
    lifetime_log,
    parent_features,
)
from tests.policy.test_ranker import synthetic


def test_predict_carries_every_parent_fact_into_the_record():
    call = ParentCall(index=4, prompt_tokens=1000, output_tokens=250, thinking=True,
                      human_turn=True, gap_s=12.5)  # fmt: skip
    features = parent_features(call, WorkerHistory(3, 2, lifetime_log(40.0) + lifetime_log(90.0)))
    assert set(features) <= {f.name for f in dataclasses.fields(SpawnFacts)}
    seen: list[SpawnRecord] = []

    class Recording:
        name = "recording"

        def predict_lifetime_s(self, record: SpawnRecord) -> float:
            seen.append(record)
            return 1.0

    predict(Recording(), SpawnFacts(**features))
    assert all(getattr(seen[0], k) == v for k, v in features.items())


def test_a_state_records_its_call_as_a_spawn_sees_it():
    facts = ResponseFacts(prompt_tokens=900, completion_tokens=54, reasoning_tokens=40)
    state = SegmentState(turn=3, facts=facts, human=True, gap_s=7.0, ended_at=50.0)
    again = SegmentState.from_json(state.to_json())
    assert (again.human, again.gap_s, again.ended_at) == (True, 7.0, 50.0)
    assert again.parent_call() == ParentCall(2, 900, 54, True, True, 7.0)
    assert SegmentState().parent_call() is None
    # A state written before these fields decodes with their defaults.
    old = SegmentState.from_json(b'{"v":1,"role":"worker","parent":"L","turn":2}')
    assert (old.human, old.gap_s, old.ended_at, old.spawned_at) == (False, 0.0, None, None)


def _extended_data() -> list[LabeledSpawn]:
    """Lifetimes that grow with the session's earlier workers (as the trace's do)."""
    out = []
    for s in range(8):
        for k in range(4):
            rec = SpawnRecord("Explore", "claude-haiku-4-5", 10000, workers_before=k,
                              workers_returned=max(0, k - 1), parent_output_tokens=100 * (k + 1),
                              returned_mean_lifetime_s=30.0 * k)  # fmt: skip
            out.append(LabeledSpawn(f"s{s}", f"s{s}/w{k}", rec, 30.0 * (k + 1) + s))
    return out


def test_a_base_artefact_ignores_the_bare_an_extended_one_uses_them():
    base = fit_ridge(synthetic(), 1.0)
    assert base.numeric_features == NUMERIC_FEATURES
    bare = SpawnFacts(subagent_type="Explore", model="claude-haiku-4-5",
                                expected_tokens=10000, parent_turn=3)  # fmt: skip
    filled = dataclasses.replace(
        bare, parent_output_tokens=900, parent_thinking=True, parent_human_turn=True,
        parent_gap_s=120.0, workers_before=5, workers_returned=4, returned_mean_lifetime_s=300.0,
    )  # fmt: skip
    assert predict(base, filled) == predict(base, bare)  # bit for bit
    extended = fit_ridge(_extended_data(), 1.0, numeric=EXTENDED_FEATURES)
    reloaded = RidgeRanker.from_json(extended.to_json())
    assert predict(reloaded, filled) != predict(reloaded, bare)
    # ... and ranks a session's later worker as longer-lived, as it was trained to.
    later = dataclasses.replace(
        bare, workers_before=3, workers_returned=2, parent_output_tokens=400,
        returned_mean_lifetime_s=90.0,
    )  # fmt: skip
    assert predict(reloaded, later) > predict(reloaded, bare)


def test_the_shipped_artefact_loads_and_is_extended():
    """``results/placement/worker_ranker.json`` is what the README tells an operator to set."""
    path = Path(__file__).resolve().parents[2] / "results" / "placement" / "worker_ranker.json"
    ranker = load_ranker(str(path))
    assert isinstance(ranker, RidgeRanker) and ranker.numeric_features == EXTENDED_FEATURES
    assert ranker.meta["trained_on"]["feature_set"] == "extended"
