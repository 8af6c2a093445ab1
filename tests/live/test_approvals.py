"""``tenure up --approvals``: the slice's scaling, the replay's prediction, the counters it reads.

The live run itself needs an engine (``results/live/approvals_*`` were made by it); these hold
the parts it is judged by: the waits put in one time unit, the prediction the live counts are
set beside, and the reading of the adapter's resume counters.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tenure.service.errors import UsageError
from tenure.service.live.approvals import (
    ApprovalSpec,
    Episode,
    _minus,
    _resumes,
    episode_waits,
    predict,
)
from tenure.service.replay.paths import claude_code_trace
from tenure.service.replay.ttl_families import human_turn_gaps

TRACE = claude_code_trace()


def _episode(at: float, wait: float, ttl: float | None, reason: str = "") -> Episode:
    reason = reason or ("regime_retain" if ttl is None else "host_ttl")
    e = Episode("s", suspended_at=at, wait_s=wait, planned_wait_s=wait, host_ttl_s=ttl)
    e.reason = reason
    return e


def test_waits_share_one_unit_with_the_pooled_mean_and_are_capped() -> None:
    cal = np.array([10.0, 20.0, 30.0, 4000.0])
    held = np.array([5.0, 15.0, 25.0, 35.0])
    spec = ApprovalSpec(trace=Path("t"), episodes=200, w_ref_s=2.0, max_wait_s=10.0)
    calibration, waits = episode_waits(cal, held, spec)
    scale = 2.0 / float(np.concatenate([cal, held]).mean())
    # One factor for both halves (not each half to its own mean); the sample keeps its tail.
    assert sorted(calibration) == pytest.approx([10 * scale, 20 * scale, 30 * scale, 4000 * scale])
    assert set(np.round(waits, 9)) <= {round(min(x * scale, 10.0), 9) for x in held}
    assert len(waits) == 200


def test_the_real_trace_gives_a_calibration_sample_the_admin_api_takes() -> None:
    if not TRACE.is_file():
        pytest.skip(f"{TRACE} is not here")
    gaps = human_turn_gaps(TRACE)
    calibration, waits = episode_waits(gaps.calibration, gaps.heldout, ApprovalSpec(TRACE))
    assert 100 < len(calibration) <= 10_000
    assert all(0 < w <= 120.0 for w in waits)
    assert max(calibration) > 120.0  # the tail the rule is chosen on is kept


def test_the_prediction_admits_while_a_slot_is_free_and_serves_until_the_timer() -> None:
    episodes = [
        _episode(0.0, 5.0, None),  # retained, holds the only slot until 5 s
        _episode(1.0, 1.0, None),  # the slot is taken: never admitted
        _episode(6.0, 3.0, 2.0),  # admitted, resumed after its 2 s timer
        _episode(10.0, 1.5, 2.0),  # admitted, back in time
    ]
    assert predict(episodes, host_slots=1) == {
        "retain": {"host": 1, "recomputed": 1},
        "ttl": {"host": 1, "recomputed": 1},
    }
    # With room for both, the second retained copy is served too.
    assert predict(episodes, host_slots=2)["retain"] == {"host": 2, "recomputed": 0}


def test_failed_episodes_are_left_out_of_the_prediction() -> None:
    bad = _episode(0.0, 1.0, None)
    bad.error = "ConnectionError: refused"
    assert predict([bad, _episode(1.0, 1.0, 0.5)], host_slots=4) == {
        "ttl": {"host": 0, "recomputed": 1}
    }


def test_resume_counters_are_read_per_branch_and_differenced() -> None:
    before = _resumes({
        'tenure_resumes_total{branch="ttl",outcome="host"}': 2.0,
        'tenure_resumes_total{branch="retain",outcome="hbm"}': 1.0,
    })  # fmt: skip
    after = _resumes({
        'tenure_resumes_total{branch="ttl",outcome="host"}': 5.0,
        'tenure_resumes_total{branch="ttl",outcome="recomputed"}': 4.0,
        'tenure_resumes_total{branch="retain",outcome="hbm"}': 1.0,
        'tenure_resumes_created{branch="ttl",outcome="host"}': 1.7e9,
        "tenure_other_total": 3.0,
    })  # fmt: skip
    assert _minus(after, before) == {"ttl": {"hbm": 0, "host": 3, "recomputed": 4}}


@pytest.mark.parametrize(
    ("field", "value"),
    [("episodes", 0), ("loads", ()), ("loads", (math.nan,)), ("w_ref_s", -1.0),
     ("max_wait_s", math.inf), ("host_slots", 0)],
)  # fmt: skip
def test_bad_settings_are_refused_with_one_line(field: str, value: object) -> None:
    with pytest.raises(UsageError):
        ApprovalSpec(trace=Path("t"), **{field: value})  # type: ignore[arg-type]


def test_an_uncongested_ttl_branch_keeps_its_copies_but_counts_as_ttl() -> None:
    # Below lambda_crit the ttl branch has no timer (reason host_retain): the adapter counts
    # such resumes under ttl, so the prediction must too.
    episodes = [_episode(0.0, 50.0, None, "host_retain"), _episode(1.0, 1.0, None, "host_retain")]
    assert predict(episodes, host_slots=2) == {"ttl": {"host": 2, "recomputed": 0}}
