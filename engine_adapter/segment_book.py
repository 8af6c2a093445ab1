"""Which SSD-tier files belong to which live segment, decided per request from its tags.

The engine-side half of placement, with no vLLM import (the tier in
:mod:`tenure.engine_adapter.tiering` feeds it): each request's ``kv_transfer_params.tenure``
(session tags plus the segment wire format of :mod:`tenure.service.wire.segments`) opens and closes
segments in a core :class:`~tenure.service.policy.segments.SegmentTable`; each block offered to the
SSD tier is classified by the segment its tokens fall in and admitted or refused by the core
placement policy; every admitted file is referenced by the segment rows that use it, and a file
is deleted when its last referencing segment closes.

Client tags are untrusted: a malformed field or an impossible boundary (a spawn under an unknown
parent, a worker returning twice, a turn going backwards) is counted under ``errors`` and the
request is served as if untagged (vLLM's behaviour: written through, never deleted). Nothing here
raises into the engine.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tenure.engine_adapter.tags import parse_tags
from tenure.service.policy.placement import PlacementPolicy, Route, WorkerSlot, fast_workers
from tenure.service.policy.segments import (
    Segment,
    SegmentClass,
    SegmentError,
    SegmentTable,
    SessionRole,
    segment_key,
)
from tenure.service.wire.segments import SegmentTags, SegmentWireError, parse_segment_tags

__all__ = ["UNTAGGED", "SegmentBook"]

log = logging.getLogger("vllm.tenure")

#: The class label of blocks of untagged requests (and of tokens outside every segment).
UNTAGGED = "untagged"


@dataclass(slots=True)
class _Req:
    session: str | None
    tags: SegmentTags
    rows: dict[str, str] = field(default_factory=dict)  # segment id -> table row key
    last_turn: bool = False
    blocks: int = 0  # the furthest block of its sequence seen offered or touched


class SegmentBook:
    """Live segments, their SSD files, and the admission decision for each offered block."""

    def __init__(
        self, placement: PlacementPolicy, fast_budget_blocks: int, block_tokens: int = 1
    ) -> None:
        self.place = placement
        self.fast_budget_blocks = fast_budget_blocks
        self.block_tokens = max(1, block_tokens)
        self._expected: dict[str, int] = {}  # worker session -> expected blocks (declared)
        self.table = SegmentTable()
        self._reqs: dict[str, _Req] = {}
        self._refs: dict[Hashable, set[str]] = {}  # file key -> rows that use it
        self._row_files: dict[str, set[Hashable]] = {}  # row -> file keys it uses
        self._owner: dict[Hashable, str] = {}  # file key -> row charged for the file
        self.file_class: dict[Hashable, str] = {}  # file key -> class label it was written as
        self._fast_sessions: frozenset[str] = frozenset()
        self._worker_blocks: Counter[str] = Counter()  # blocks offered per worker session
        self._returned_sizes: list[int] = []
        self._spawn_order = 0
        self._order: dict[str, int] = {}
        self._context_blocks: dict[str, int] = {}  # session -> blocks of its latest request
        self.errors: Counter[str] = Counter()

    # --- requests ---------------------------------------------------------------------------

    def begin(self, req_id: str, kv_transfer_params: Any) -> list[Hashable]:
        """A request arrived: register its session and segments; returns files to delete."""
        tags = parse_tags(kv_transfer_params)
        if tags.invalid:
            self.errors["tags"] += tags.invalid
        raw = kv_transfer_params.get("tenure") if isinstance(kv_transfer_params, dict) else None
        if tags.session_id is None or not isinstance(raw, dict):
            self._reqs[req_id] = _Req(None, SegmentTags())
            return []
        sid = tags.session_id
        try:
            seg_tags = parse_segment_tags(raw)
        except SegmentWireError as exc:
            self._error("segments", f"request {req_id}: {exc}")
            seg_tags = SegmentTags()
        if not self._register(sid, seg_tags, req_id):
            self._reqs[req_id] = _Req(None, SegmentTags())
            return []
        req = _Req(sid, seg_tags, last_turn=tags.last_turn)
        self._reqs[req_id] = req
        closed: list[Segment] = []
        declared = [span.id for span in seg_tags.segments]
        try:
            closed.extend(self.table.next_turn(sid, tags.turn, keep=declared))
        except SegmentError as exc:
            self._error("boundary", f"request {req_id}: {exc}")
        for span in seg_tags.segments:
            row = self.table.get(sid, span.id)
            if row is None:
                try:
                    row = self.table.open(sid, span.id, span.cls)
                except SegmentError as exc:
                    self._error("boundary", f"request {req_id}: {exc}")
                    continue
            req.rows[span.id] = row.key
        for seg_id in seg_tags.close:
            try:
                closed.extend(self.table.close(sid, seg_id))
            except SegmentError as exc:
                self._error("boundary", f"request {req_id}: {exc}")
        return self._close_rows(closed)

    def finish(self, req_id: str) -> list[Hashable]:
        """The request ended (no more stores for it): a declared last turn ends its session."""
        req = self._reqs.pop(req_id, None)
        if req is None or req.session is None:
            return []
        sid = req.session
        if not req.last_turn:
            self._context_blocks[sid] = req.blocks
            return []
        self._context_blocks.pop(sid, None)
        try:
            if self.table.role(sid) is SessionRole.LEAD:
                closed = self.table.end_session(sid)
            else:
                closed = self.table.worker_return(sid)
        except SegmentError as exc:
            self._error("boundary", f"request {req_id}: {exc}")
            return []
        self._retire_worker(sid)
        deleted = self._close_rows(closed)
        self.table.forget_ended()
        return deleted

    # --- blocks -----------------------------------------------------------------------------

    def classify(self, req_id: str, lo: int | None, hi: int | None) -> tuple[str, str | None]:
        """``(class label, segment row)`` of the block of tokens ``[lo, hi)`` of a request."""
        req = self._reqs.get(req_id)
        if req is None or req.session is None or lo is None or hi is None:
            return UNTAGGED, None
        span = req.tags.span_at(lo, hi)
        if span is None:
            return UNTAGGED, None
        return span.cls.value, req.rows.get(span.id)

    def admit(self, req_id: str, key: Hashable, lo: int | None, hi: int | None) -> bool:
        """Should this block be written to the SSD tier? Records the file's segment if so."""
        self._seen(req_id, hi)
        label, row = self.classify(req_id, lo, hi)
        if label == UNTAGGED:
            return True  # vLLM's own behaviour: every block cascades
        cls = SegmentClass(label)
        req = self._reqs[req_id]
        if cls is SegmentClass.WORKER and req.session is not None:
            self._worker_blocks[req.session] += 1
        fast = req.session in self._fast_sessions
        if self.place.route(cls, fast) is Route.FAST_ONLY:
            return False
        if row is not None:
            self._ref(key, row)
            self._owner.setdefault(key, row)
        self.file_class.setdefault(key, label)
        return True

    def touch(self, req_id: str, key: Hashable, lo: int | None, hi: int | None) -> None:
        """A request used ``key`` (a prefix hit): its segment keeps the file alive too."""
        self._seen(req_id, hi)
        if key not in self._refs:
            return
        _label, row = self.classify(req_id, lo, hi)
        if row is not None:
            self._ref(key, row)

    def written(self, key: Hashable) -> None:
        """The file for ``key`` now exists on disk (counted against its owning segment)."""
        row = self._owner.get(key)
        if row is not None and self.table.segment(row) is not None:
            self.table.charge(row, "ssd", 1)

    def deleted(self, key: Hashable, was_written: bool) -> str:
        """The file for ``key`` is gone; returns the class label it was written as."""
        row = self._owner.pop(key, None)
        if was_written and row is not None and self.table.segment(row) is not None:
            self.table.charge(row, "ssd", -1)
        return self.file_class.pop(key, UNTAGGED)

    def owns(self, key: Hashable) -> bool:
        """Whether a live segment references ``key`` (so a close may delete it)."""
        return key in self._refs

    # --- internals ------------------------------------------------------------------------

    def _seen(self, req_id: str, hi: int | None) -> None:
        req = self._reqs.get(req_id)
        if req is not None and hi is not None:
            req.blocks = max(req.blocks, -(-hi // self.block_tokens))

    def _error(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        if self.errors[kind] <= 5:
            log.warning("tenure: %s (request served without segments)", message)

    def _register(self, sid: str, tags: SegmentTags, req_id: str) -> bool:
        known = self.table.role(sid)
        try:
            if tags.role is SessionRole.LEAD:
                self.table.open_lead(sid)
            elif known is None:
                assert tags.parent_session is not None  # the wire parser guarantees it
                self.table.spawn(sid, tags.parent_session, tags.role, tags.predicted_lifetime_s)
                self._spawn_order += 1
                self._order[sid] = self._spawn_order
                if tags.expected_tokens is not None:
                    self._expected[sid] = -(-tags.expected_tokens // self.block_tokens)
                self._rerank()
            elif known is not tags.role:
                raise SegmentError(f"session {sid!r} is a {known.value}, not a {tags.role.value}")
        except SegmentError as exc:
            self._error("boundary", f"request {req_id}: {exc}")
            return False
        return True

    def _rerank(self) -> None:
        if not self.place.ranks_workers:
            return
        typical = (
            sorted(self._returned_sizes)[len(self._returned_sizes) // 2]
            if (self._returned_sizes)
            else 1
        )
        pinned = sum(
            len(self._row_files.get(seg.key, ()))
            for seg in self.table.live()
            if seg.cls in (SegmentClass.REASONING, SegmentClass.REVIEWER)
        )
        slots = [
            WorkerSlot(
                seg.session,
                float("inf") if seg.predicted_lifetime_s is None else seg.predicted_lifetime_s,
                max(self._worker_blocks[seg.session], self._expected.get(seg.session, typical)),
                self._order.get(seg.session, 0),
            )
            for seg in self.table.workers()
            if seg.key == segment_key(seg.session, "context")
        ]
        # The primary tier stages every SSD read: keep room for the largest context of a live
        # session (its latest request, finished or running).
        live = set(self.table.live_sessions())
        staging = max(
            [n for sid, n in self._context_blocks.items() if sid in live]
            + [r.blocks for r in self._reqs.values()],
            default=0,
        )
        self._fast_sessions = fast_workers(slots, self.fast_budget_blocks - pinned - staging)

    def _retire_worker(self, sid: str) -> None:
        if sid in self._order:
            del self._order[sid]
            self._expected.pop(sid, None)
            self._returned_sizes.append(self._worker_blocks.pop(sid, 0))
            self._returned_sizes = self._returned_sizes[-256:]
            self._rerank()

    def _ref(self, key: Hashable, row: str) -> None:
        self._refs.setdefault(key, set()).add(row)
        self._row_files.setdefault(row, set()).add(key)

    def _close_rows(self, closed: Iterable[Segment]) -> list[Hashable]:
        delete: list[Hashable] = []
        for seg in closed:
            for key in self._row_files.pop(seg.key, ()):
                rows = self._refs.get(key)
                if rows is None:
                    continue
                rows.discard(seg.key)
                if not rows:
                    del self._refs[key]
                    delete.append(key)
        return delete

    def open_segments(self) -> int:
        return sum(1 for _ in self.table.live())

    def files_tracked(self) -> int:
        return len(self._refs)
