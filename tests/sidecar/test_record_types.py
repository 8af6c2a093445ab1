"""Types that carry the same record in two places are tied here, so they cannot drift apart.

The session hash has one list of field names
(:class:`~tenure.service.wire.session_record.RecordField`); the Lua scripts, the typed reading
(``SessionRecord``) and the API's view (``SessionView``) are checked against it. The recorder's
status and its admin view, a session's segment state and its stored JSON, and a ``tenure-fs`` tier's
placement totals and the report made of them are checked field for field.
"""

from __future__ import annotations

import dataclasses
import re

import msgspec

from tenure.engine_adapter.placement_push import (
    PLACEMENT_COUNTERS,
    PLACEMENT_GAUGES,
    PlacementTotals,
    placement_delta,
)
from tenure.service.api.routes.record_admin import RecordStatusView
from tenure.service.api.routes.session_views import SessionView
from tenure.service.api.segments.state import SegmentState, _StateWire
from tenure.service.api.turns.recorder import RecordStatus
from tenure.service.state import scripts
from tenure.service.wire.push import PlacementReport
from tenure.service.wire.session_record import RecordField, SessionRecord

#: Hash fields the typed record does not read: the scripts' own (the undo log, an inferred
#: session's prefix keys, the end of the last turn the next turn's gap is measured from).
_SCRIPT_ONLY = {RecordField.UNDO, RecordField.PREFIX_KEYS, RecordField.LAST_END}
#: What the API view leaves out of the record, and what it adds (computed per request).
_NOT_SHOWN = {"id", "version", "retention_s", "fields"}
_VIEW_ONLY = {"session_id", "eviction_class", "predicted_lifetime_s"}


def test_the_session_record_reads_every_field_of_the_hash() -> None:
    record_fields = set(SessionRecord.__struct_fields__) - {"fields"}
    assert record_fields == {f.value for f in RecordField} - _SCRIPT_ONLY


def test_every_field_a_script_reads_is_a_record_field() -> None:
    known = {f.value for f in RecordField}
    lua = "\n".join(
        value for name, value in vars(scripts).items() if name.isupper() and isinstance(value, str)
    )
    named = set()
    for call in re.finditer(r"HMGET', [^,]+,((?:\s*'[a-z_]+',?)+)", lua):
        named |= set(re.findall(r"'([a-z_]+)'", call.group(1)))
    assert named, "no HMGET field list found in the scripts"
    assert named <= known, named - known


def test_a_hash_with_every_field_is_read_whole() -> None:
    raw = {f.value: "1" for f in RecordField}
    raw.update(state="idle", segments='["a"]', workers='["w"]', metadata="{}")
    record = SessionRecord.from_hash(raw)
    defaults = SessionRecord(fields={})
    unread = [
        name
        for name in SessionRecord.__struct_fields__
        if name != "fields" and getattr(record, name) == getattr(defaults, name)
    ]
    assert unread == []


def test_the_session_view_shows_the_record() -> None:
    record_fields = set(SessionRecord.__struct_fields__)
    assert set(SessionView.model_fields) == (record_fields - _NOT_SHOWN) | _VIEW_ONLY


def test_the_record_status_view_is_the_status() -> None:
    status = {f.name: f.type for f in dataclasses.fields(RecordStatus)}
    view = {name: f.annotation for name, f in RecordStatusView.model_fields.items()}
    assert list(status) == list(view)
    assert [str(t) for t in status.values()] == [t.__name__ for t in view.values()]  # type: ignore[union-attr]


def test_the_stored_segment_state_has_every_field() -> None:
    stored = set(_StateWire.__struct_fields__) - {"v"}
    assert stored == {f.name for f in dataclasses.fields(SegmentState)}
    # And a state survives the trip through its JSON.
    state = SegmentState(model="m", turn=3, human=True, gap_s=1.5, spawned_at=2.0)
    assert SegmentState.from_json(state.to_json()) == state
    assert msgspec.json.decode(state.to_json())["v"] == 1


#: What a placement report carries beside the tier's fields: who sent it, its number, when.
_REPORT_ENVELOPE = {"adapter_id", "report_seq", "at"}


def test_the_placement_report_is_the_totals_with_an_envelope() -> None:
    totals = [f.name for f in dataclasses.fields(PlacementTotals)]
    report = list(PlacementReport.__struct_fields__)
    assert [n for n in report if n not in _REPORT_ENVELOPE] == totals
    assert set(PLACEMENT_COUNTERS) | set(PLACEMENT_GAUGES) == set(totals)
    # Gauges go out as they are: the same type on both sides.
    hints = {f.name: str(f.type) for f in dataclasses.fields(PlacementTotals)}
    wire = {f.name: _type_name(f.type) for f in msgspec.structs.fields(PlacementReport)}
    for name in PLACEMENT_GAUGES:
        assert hints[name].replace(" ", "") == wire[name], name


def _type_name(tp: object) -> str:
    """``int`` for ``<class 'int'>``, ``float|None`` for ``float | None``."""
    return str(tp).replace("<class '", "").replace("'>", "").replace(" ", "")


def test_every_totals_field_reaches_the_report() -> None:
    """A report made from totals with every field set carries each one (counters as deltas)."""
    totals = PlacementTotals(
        placement="lachesis-wt", write_bytes={("ssd", "lead"): 7}, kept_off_ssd_bytes={"x": 3},
        deleted_bytes={"worker": 2}, deleted_files=4, ssd_used_bytes=5, ssd_files=6,
        ssd_capacity_bytes=8, ssd_warranty_years=9.0, ssd_write_rate_bytes_per_s=10.0,
        projected_device_years=11.0,
    )  # fmt: skip
    report = placement_delta(totals, None, adapter_id="e", seq=1, at=0.0)
    for name in PLACEMENT_GAUGES:
        assert getattr(report, name) == getattr(totals, name), name
    assert report.write_bytes == {"ssd": {"lead": 7}}
    assert (report.kept_off_ssd_bytes, report.deleted_bytes) == ({"x": 3}, {"worker": 2})
    assert report.deleted_files == 4
    # Every field of the totals was set to a non-default value above (the test covers them all).
    blank = PlacementTotals()
    assert all(
        getattr(totals, f) != getattr(blank, f) for f in PLACEMENT_GAUGES + PLACEMENT_COUNTERS
    )
