"""Placement policies, the predictive path, the DRAM guard, the segment wire format, endurance."""

from __future__ import annotations

import math

import pytest

from tenure.service.policy import HostTier, Run, create_policy
from tenure.service.policy.endurance import SECONDS_PER_YEAR, Endurance, WriteRateMeter
from tenure.service.policy.placement import (
    Route,
    UnknownPlacementError,
    WorkerSlot,
    create_placement,
    fast_workers,
    placement_names,
)
from tenure.service.policy.placement_guard import PlacementGuard
from tenure.service.policy.segments import SegmentClass, SessionRole
from tenure.service.wire.segments import SegmentWireError, parse_segment_tags

ALL = placement_names()


@pytest.mark.parametrize("name", ALL)
def test_every_placement_routes_every_class(name):
    """Contract over every registered placement: a total, deterministic route per class."""
    policy = create_placement(name)
    assert policy.name == name
    for cls in SegmentClass:
        for fast in (False, True):
            assert policy.route(cls, fast) in Route
            assert policy.route(cls, fast) == create_placement(name).route(cls, fast)
    assert set(policy.routes()) == {c.value for c in SegmentClass} | {"worker_fast"}
    assert policy.host_min_offers >= 1 and policy.ssd_min_uses >= 1


def test_unknown_placement_lists_the_valid_names():
    with pytest.raises(UnknownPlacementError, match=r"valid: .*lachesis"):
        create_placement("hbm-first")


def test_lachesis_deterministic_path():
    """Reasoning and reviewers never reach the SSD tier; lead context may (on eviction)."""
    place = create_placement("lachesis")
    assert place.route(SegmentClass.REASONING) is Route.FAST_ONLY
    assert place.route(SegmentClass.REVIEWER) is Route.FAST_ONLY
    assert place.route(SegmentClass.LEAD) is Route.ON_EVICTION
    assert place.route(SegmentClass.OUTPUT) is Route.ON_EVICTION
    assert place.route(SegmentClass.WORKER, fast_worker=False) is Route.ON_EVICTION
    assert place.route(SegmentClass.WORKER, fast_worker=True) is Route.FAST_ONLY
    assert place.lifecycle_aware and place.guards_fast_tier


def test_enforceable_and_ablation_variants():
    wt = create_placement("lachesis-wt")
    assert wt.route(SegmentClass.LEAD) is Route.WRITE_THROUGH
    assert wt.route(SegmentClass.REASONING) is Route.FAST_ONLY
    assert not wt.cascades_on_eviction() and not wt.guards_fast_tier
    no_rank = create_placement("lachesis-no-ranker")
    assert no_rank.route(SegmentClass.WORKER, fast_worker=True) is Route.ON_EVICTION
    assert not no_rank.ranks_workers


def test_baselines_are_lifecycle_blind():
    for name in ("write-through", "dram-first", "frequency-filter", "store-threshold"):
        assert not create_placement(name).lifecycle_aware
    assert create_placement("frequency-filter").ssd_min_uses == 2
    assert create_placement("store-threshold").host_min_offers == 2
    assert create_placement("dram-first").route(SegmentClass.REASONING) is Route.ON_EVICTION


def test_fast_workers_keeps_the_shortest_predicted_first_k_that_fit():
    slots = [
        WorkerSlot("long", 500.0, 4, 1),
        WorkerSlot("short", 10.0, 4, 2),
        WorkerSlot("mid", 100.0, 4, 3),
    ]
    assert fast_workers(slots, 12) == {"long", "short", "mid"}
    assert fast_workers(slots, 8) == {"short", "mid"}
    assert fast_workers(slots, 7) == {"short"}
    assert fast_workers(slots, 3) == frozenset()
    # Ties go to the earlier spawn; k is a prefix of the ranking (no skipping ahead).
    tied = [WorkerSlot("b", 5.0, 2, 2), WorkerSlot("a", 5.0, 2, 1), WorkerSlot("c", 9.0, 1, 3)]
    assert fast_workers(tied, 2) == {"a"}


def test_guard_evicts_unpinned_blocks_first_and_falls_back_when_it_must():
    """The DRAM guard protects fast-only runs from LRU unless nothing else can be evicted."""
    pinned: list[Run] = []
    tier = HostTier(PlacementGuard(create_policy("lru"), lambda: pinned), 6)
    lead, worker, other = (tier.segment(k, session=k) for k in ("lead", "worker", "other"))
    assert tier.store([Run(worker, 0, 3)], "worker", 1.0).admitted  # oldest: LRU's first pick
    assert tier.store([Run(lead, 0, 3)], "lead", 2.0).admitted
    pinned.append(Run(worker, 0, 3))
    res = tier.store([Run(other, 0, 2)], "other", 3.0)
    assert res.admitted
    assert {v.run.seg for v in res.victims} == {lead}
    assert tier.resident_blocks(worker) == 3
    # Everything else pinned too: the guard yields rather than refuse an admissible store.
    pinned.append(Run(other, 0, 2))
    res = tier.store([Run(lead, 3, 6)], "lead", 4.0)
    assert res.admitted and tier.policy.counters["guard_fallbacks"] == 1


def test_segment_wire_round_trip():
    raw = {
        "role": "worker",
        "parent_session": "L",
        "predicted_lifetime_s": 42,
        "expected_tokens": 900,
        "segments": [
            {"id": "ctx", "class": "worker", "start": 0},
            {"id": "t1.reasoning", "class": "reasoning", "start": 300},
            {"id": "t1.out", "class": "output", "start": 400},
        ],
        "close": ["t0.reasoning"],
    }
    tags = parse_segment_tags(raw)
    assert tags.role is SessionRole.WORKER and tags.predicted_lifetime_s == 42.0
    assert parse_segment_tags(tags.to_wire()) == tags
    # A block straddling a boundary takes the shortest-lived class it overlaps.
    assert tags.span_at(0, 128) is not None and tags.span_at(0, 128).id == "ctx"  # type: ignore[union-attr]
    assert tags.span_at(256, 384).cls is SegmentClass.REASONING  # type: ignore[union-attr]
    assert tags.span_at(384, 512).cls is SegmentClass.REASONING  # type: ignore[union-attr]
    assert tags.span_at(512, 640).cls is SegmentClass.OUTPUT  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"segments": [{"id": "a", "class": "lead", "start": 5}]}, "segments[0].start"),
        (
            {
                "segments": [
                    {"id": "a", "class": "lead", "start": 0},
                    {"id": "b", "class": "lead", "start": 0},
                ]
            },
            "segments[1].start",
        ),
        ({"segments": [{"id": "a", "class": "thinking", "start": 0}]}, "segments[0].class"),
        ({"segments": [{"id": "a b", "class": "lead", "start": 0}]}, "segments[0].id"),
        ({"segments": [{"id": "a", "class": "lead", "start": 0, "x": 1}]}, "unknown field"),
        ({"segments": "ctx"}, "segments"),
        ({"segments": [{"id": "a", "class": "lead", "start": 0}] * 2}, "appears twice"),
        ({"role": "worker"}, "parent_session"),
        ({"role": "lead", "parent_session": "P"}, "parent_session"),
        ({"role": "boss"}, "role"),
        ({"predicted_lifetime_s": -3}, "predicted_lifetime_s"),
        ({"predicted_lifetime_s": float("nan")}, "predicted_lifetime_s"),
        ({"expected_tokens": 1.5}, "expected_tokens"),
        ({"close": "r1"}, "close"),
        ({"close": ["ok", ""]}, "close[1]"),
        ({"segments": [{"id": f"s{i}", "class": "lead", "start": i} for i in range(65)]}, "64"),
    ],
)
def test_segment_wire_errors_name_the_field(raw, field):
    with pytest.raises(SegmentWireError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_segment_tags(raw)


def test_endurance_from_dwpd_equals_the_rated_tbw():
    """Micron 7450 PRO 3.84 TB: 1 DWPD x 5 years = 7,008 TB (Micron quotes 7.0 PBW)."""
    e = Endurance.from_dwpd(1.0, 3.84e12, 5.0)
    assert e.rated_bytes_written == pytest.approx(7008e12)
    rate = e.rated_bytes_written / (5.0 * SECONDS_PER_YEAR)  # exactly the warranty's rate
    assert e.device_years(rate) == pytest.approx(5.0)
    assert e.outlasts_warranty(rate) and not e.outlasts_warranty(rate * 1.01)
    assert math.isinf(e.device_years(0.0))
    assert e.scaled(2.0).device_years(rate) == pytest.approx(10.0)
    with pytest.raises(ValueError):
        Endurance(0.0, 5.0)


def test_write_rate_meter_tracks_a_steady_rate_and_queries_change_nothing():
    meter = WriteRateMeter(half_life_s=60.0)
    for t in range(0, 600):
        meter.observe(float(t), 1000.0)
    assert meter.rate(600.0) == pytest.approx(1000.0, rel=0.02)
    assert meter.rate(600.0) == meter.rate(600.0)
    assert meter.total_bytes == 600_000.0
    # Writes stop: the rate decays (half-life 60 s) instead of staying at the lifetime mean.
    assert meter.rate(720.0) < 400.0
    assert WriteRateMeter().rate(5.0) == 0.0
