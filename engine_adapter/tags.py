"""The per-request lifecycle tags the sidecar puts in ``kv_transfer_params.tenure``.

Parsed once per request (cached in the request's ``ReqContext`` state). Tags come from clients
we do not control, so a malformed field is dropped (and counted by the caller), never raised
inside the engine: the request is then served tags-off, which is never worse than LRU.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

__all__ = ["RequestTags", "parse_tags"]

_MAX_ID = 256


class RequestTags(NamedTuple):
    """What one request says about its session; ``session_id`` ``None`` = untagged."""

    session_id: str | None = None
    segment: str = "main"
    turn: int = 0
    last_turn: bool = False
    expected_gap_s: float | None = None
    suspended: bool = False
    #: Number of fields that were present but malformed (dropped).
    invalid: int = 0


def _text(value: Any) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= _MAX_ID:
        return value
    return None


def _non_negative(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def parse_tags(kv_transfer_params: Any) -> RequestTags:
    """Read ``kv_transfer_params["tenure"]``; anything malformed is ignored and counted."""
    if not isinstance(kv_transfer_params, dict):
        return RequestTags()
    raw = kv_transfer_params.get("tenure")
    if raw is None:
        return RequestTags()
    if not isinstance(raw, dict):
        return RequestTags(invalid=1)
    invalid = 0
    session_id = _text(raw.get("session_id"))
    if "session_id" in raw and session_id is None:
        invalid += 1
    segment = raw.get("segment", "main")
    if isinstance(segment, int) and not isinstance(segment, bool):
        segment = str(segment)
    if _text(segment) is None:
        invalid += 1
        segment = "main"
    turn = raw.get("turn", 0)
    if not isinstance(turn, int) or isinstance(turn, bool) or turn < 0:
        invalid += 1
        turn = 0
    last_turn = raw.get("last_turn", False)
    if not isinstance(last_turn, bool):
        invalid += 1
        last_turn = False
    suspended = raw.get("suspended", False)
    if not isinstance(suspended, bool):
        invalid += 1
        suspended = False
    # The sidecar sends seconds; harness-set tags (the header's unit) may use milliseconds.
    expected_gap_s: float | None = None
    for name, scale in (("expected_gap_s", 1.0), ("expected_gap_ms", 1000.0)):
        value = raw.get(name)
        if value is None:
            continue
        if _non_negative(value):
            expected_gap_s = float(value) / scale
            break
        invalid += 1
    return RequestTags(
        session_id=session_id,
        segment=segment,
        turn=turn,
        last_turn=last_turn,
        expected_gap_s=expected_gap_s,
        suspended=suspended,
        invalid=invalid,
    )
