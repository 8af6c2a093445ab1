"""The worker ranker: Kendall tau, grouped folds, ridge determinism, the artefact, fallbacks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tenure.service.policy.ranker import (
    EXTENDED_FEATURES,
    NUMERIC_FEATURES,
    HeuristicRanker,
    RankerArtefactError,
    RidgeRanker,
    SpawnRecord,
    model_family,
)
from tenure.service.policy.ranker_fit import (
    LabeledSpawn,
    cross_validate,
    fit_pairwise,
    fit_ridge,
    grouped_folds,
    kendall_tau,
    within_session_tau,
)


def test_kendall_tau_b_on_known_rankings():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # 5 concordant, 1 discordant pair of 6: (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with ties: x has one tied pair; sqrt((6 - 1) * 6) in the denominator.
    assert kendall_tau([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))
    assert math.isnan(kendall_tau([1, 1, 1], [1, 2, 3]))
    assert within_session_tau(["a", "a", "b", "b"], [1, 2, 2, 1], [1, 2, 1, 2]) == 0.0


def test_grouped_folds_never_split_a_session():
    sessions = [f"s{i % 7}" for i in range(40)]
    folds = grouped_folds(sessions, 5)
    assert len(folds) == 5 and sorted(i for f in folds for i in f) == list(range(40))
    for fold in folds:
        inside = {sessions[i] for i in fold}
        outside = {sessions[i] for f in folds if f is not fold for i in f}
        assert not inside & outside
    assert grouped_folds(sessions, 5) == folds  # deterministic


def synthetic(n_sessions: int = 8) -> list[LabeledSpawn]:
    """Lifetimes driven by fan-out position and type, as the Claude Code trace's are."""
    out = []
    for s in range(n_sessions):
        for k in range(4):
            kind = "Plan" if k == 3 else "Explore"
            life = 60.0 * (1 + k) * (3.0 if kind == "Plan" else 1.0) * (1 + 0.1 * s)
            rec = SpawnRecord(
                kind, "claude-haiku-4-5", 10000 + 10 * k, 7000, 900, False, 3, 50000, 4, k
            )
            out.append(LabeledSpawn(f"s{s}", f"s{s}/w{k}", rec, life))
    return out


def test_ridge_learns_a_signal_and_is_deterministic(tmp_path: Path):
    data = synthetic()
    a = fit_ridge(data, 1.0)
    b = fit_ridge(list(data), 1.0)
    assert a.to_json() == b.to_json()
    cv = cross_validate(data)
    assert cv["rankers"]["ridge"]["kendall_tau"] > 0.6
    assert cv == cross_validate(data)
    assert math.isnan(cv["rankers"]["spawn-order"]["kendall_tau"])
    path = tmp_path / "ranker.json"
    a.save(path)
    loaded = RidgeRanker.load(path)
    assert loaded.to_json() == a.to_json()
    for d in data:
        assert loaded.predict_lifetime_s(d.record) == pytest.approx(a.predict_lifetime_s(d.record))
    json.loads(path.read_text())  # strict JSON (no NaN)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"format": "other"}', "not a tenure-worker-ranker"),
        ('{"format": "tenure-worker-ranker", "version": 9}', "version 9"),
    ],
)
def test_a_bad_artefact_gives_a_one_line_error(tmp_path: Path, content, message):
    path = tmp_path / "ranker.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(RankerArtefactError, match=message) as info:
        RidgeRanker.load(path)
    assert "\n" not in str(info.value)


def test_a_tampered_artefact_is_refused(tmp_path: Path):
    doc = fit_ridge(synthetic(), 1.0).to_json()
    for key, bad in (("weights", [1.0]), ("mean", "x"), ("alpha", float("inf")), ("vocab", {})):
        broken = {**doc, key: bad}
        with pytest.raises(RankerArtefactError):
            RidgeRanker.from_json(json.loads(json.dumps(broken)))


def test_heuristic_fallback_orders_by_type():
    h = HeuristicRanker()
    explore = h.predict_lifetime_s(SpawnRecord("Explore"))
    plan = h.predict_lifetime_s(SpawnRecord("Plan"))
    unknown = h.predict_lifetime_s(SpawnRecord("reviewer-x"))
    assert explore < unknown < plan
    assert model_family("claude-haiku-4-5-20251001") == "haiku"
    assert model_family("") == "" and model_family("mystery") == "other"


def with_history(n_sessions: int = 8) -> list[LabeledSpawn]:
    """Workers whose lifetime grows with how many the session spawned before (the Claude Code
    trace's strongest spawn-time signal), invisible to the base features."""
    out = []
    for s in range(n_sessions):
        for k in range(4):
            life = 50.0 * (1 + k) * (1 + 0.05 * s)
            rec = SpawnRecord("Explore", "claude-haiku-4-5", 10000, 7000, 900, workers_before=k)
            out.append(LabeledSpawn(f"s{s}", f"s{s}/w{k}", rec, life))
    return out


def test_extended_features_carry_the_session_history(tmp_path: Path):
    data = with_history()
    cv = cross_validate(data)
    # The base features are identical across a session's workers: nothing to rank by.
    assert cv["rankers"]["ridge-extended"]["kendall_tau_within_session"] > 0.9
    assert cv["rankers"]["pairwise-extended"]["kendall_tau_within_session"] > 0.9
    assert not cv["rankers"]["ridge"]["kendall_tau_within_session"] > 0.5
    assert cv == cross_validate(data)  # deterministic
    model = fit_ridge(data, 1.0, numeric=EXTENDED_FEATURES)
    path = tmp_path / "extended.json"
    model.save(path)
    loaded = RidgeRanker.load(path)
    assert loaded.numeric_features == EXTENDED_FEATURES
    assert loaded.to_json() == model.to_json()
    early, late = data[0].record, data[3].record
    assert loaded.predict_lifetime_s(early) < loaded.predict_lifetime_s(late)
    pairwise = fit_pairwise(data, 1.0)
    assert pairwise.predict_log(early) < pairwise.predict_log(late)


def test_a_version_1_artefact_still_loads():
    doc = fit_ridge(synthetic(), 1.0).to_json()
    old = {k: v for k, v in doc.items() if k != "numeric_features"} | {"version": 1}
    loaded = RidgeRanker.from_json(json.loads(json.dumps(old)))
    assert loaded.numeric_features == NUMERIC_FEATURES
    rec = synthetic()[0].record
    assert loaded.predict_log(rec) == pytest.approx(fit_ridge(synthetic(), 1.0).predict_log(rec))
    with pytest.raises(RankerArtefactError, match="unknown feature"):
        RidgeRanker.from_json({**doc, "numeric_features": ["log_context_tokens", "secret"]})
