"""Types that carry the same record in two places are tied here, so they cannot drift apart.

The session hash has one list of field names
(:class:`~tenure.service.wire.session_record.RecordField`); the Lua scripts, the typed reading
(``SessionRecord``) and the API's view (``SessionView``) are checked against it. The recorder's
status and its admin view, and a session's segment state and its stored JSON, are checked field for
field.
"""

from __future__ import annotations

import dataclasses
import re

import msgspec

from tenure.service.api.routes.record_admin import RecordStatusView
from tenure.service.api.routes.session_views import SessionView
from tenure.service.api.segments.state import SegmentState, _StateWire
from tenure.service.api.turns.recorder import RecordStatus
from tenure.service.state import scripts
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
