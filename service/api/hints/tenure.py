"""Lifecycle hints: parsed and validated from ``X-Tenure-*`` headers or a ``tenure`` body object.

Both forms carry the same fields; giving one field both ways with different values is an error.
Every error names the offending field (``HintError.param``) and the request is not forwarded.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HEADER_EXPECTED_GAP",
    "HEADER_LAST_TURN",
    "HEADER_PARENT",
    "HEADER_REASONING",
    "HEADER_SEGMENT",
    "HEADER_SESSION",
    "MAX_GAP_S",
    "HintError",
    "Hints",
    "parse_hints",
    "validate_id",
]

HEADER_SESSION = "x-tenure-session"
HEADER_LAST_TURN = "x-tenure-last-turn"
HEADER_EXPECTED_GAP = "x-tenure-expected-gap-ms"
HEADER_SEGMENT = "x-tenure-segment"
HEADER_PARENT = "x-tenure-parent"
#: Whether this turn's response reasons (its generation is declared a reasoning segment).
HEADER_REASONING = "x-tenure-reasoning"

#: Longest gap a hint may declare (30 days): anything longer is a unit mistake.
MAX_GAP_S = 30 * 86400.0
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_BODY_FIELDS = frozenset(
    {
        "session",
        "session_id",
        "last_turn",
        "expected_gap_ms",
        "expected_gap_s",
        "segment",
        "parent",
        "reasoning",
    }
)


_KNOWN_PARAMS = frozenset(
    {
        "X-Tenure-Session",
        "X-Tenure-Last-Turn",
        "X-Tenure-Expected-Gap-Ms",
        "X-Tenure-Segment",
        "X-Tenure-Parent",
        "X-Tenure-Reasoning",
        "tenure",
        "body",
        "kv_transfer_params",
        *(f"tenure.{name}" for name in _BODY_FIELDS),
    }
)


class HintError(ValueError):
    """A malformed hint; ``param`` names the header or body field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message

    @property
    def label(self) -> str:
        """``param`` as a metric label: the known names, else one bucket (client text such as
        an unknown ``tenure.<name>`` must never become a label value of its own)."""
        return self.param if self.param in _KNOWN_PARAMS else "tenure.unknown"


@dataclass(frozen=True, slots=True)
class Hints:
    session: str | None = None
    last_turn: bool = False
    expected_gap_s: float | None = None
    segment: str | None = None
    parent: str | None = None
    #: How long the harness asks the session's prefix to be kept (a ``cache_control`` TTL,
    #: from a route's own field or a dialect); forwarded as ``retention_s``. Not a session
    #: hint on its own (see ``any``): a request that only carries it stays untracked.
    retention_s: float | None = None
    reasoning: bool | None = None

    @property
    def any(self) -> bool:
        return (
            self.reasoning is not None
            or self.session is not None
            or self.last_turn
            or self.expected_gap_s is not None
            or self.segment is not None
            or self.parent is not None
        )


NO_HINTS = Hints()


def validate_id(param: str, value: object) -> str:
    if not isinstance(value, str):
        raise HintError(param, f"{param} must be a string")
    if not _ID.match(value):
        raise HintError(
            param, f"{param} must be 1-128 characters of [A-Za-z0-9._:-], starting alphanumeric"
        )
    return value


def _gap_seconds(param: str, value: object, scale: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HintError(param, f"{param} must be a number")
    try:
        seconds = float(value) * scale
    except OverflowError:  # an integer of hundreds of digits
        raise HintError(param, f"{param} is over 30 days; check the unit") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise HintError(param, f"{param} must be a finite number >= 0")
    if seconds > MAX_GAP_S:
        raise HintError(param, f"{param} is over 30 days; check the unit")
    return seconds


def _bool(param: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
    raise HintError(param, f"{param} must be true or false")


def _from_headers(headers: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    value = headers.get(HEADER_SESSION)
    if value is not None:
        found["session"] = (validate_id("X-Tenure-Session", value), "X-Tenure-Session")
    value = headers.get(HEADER_LAST_TURN)
    if value is not None:
        found["last_turn"] = (_bool("X-Tenure-Last-Turn", value), "X-Tenure-Last-Turn")
    value = headers.get(HEADER_EXPECTED_GAP)
    if value is not None:
        param = "X-Tenure-Expected-Gap-Ms"
        try:
            number = float(value)
        except ValueError:
            raise HintError(param, f"{param} must be a number of milliseconds") from None
        found["expected_gap_s"] = (_gap_seconds(param, number, 0.001), param)
    value = headers.get(HEADER_SEGMENT)
    if value is not None:
        found["segment"] = (validate_id("X-Tenure-Segment", value), "X-Tenure-Segment")
    value = headers.get(HEADER_PARENT)
    if value is not None:
        found["parent"] = (validate_id("X-Tenure-Parent", value), "X-Tenure-Parent")
    value = headers.get(HEADER_REASONING)
    if value is not None:
        found["reasoning"] = (_bool("X-Tenure-Reasoning", value), "X-Tenure-Reasoning")
    return found


def _from_body(obj: object) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise HintError("tenure", "tenure must be an object")
    unknown = set(obj) - _BODY_FIELDS
    if unknown:
        name = sorted(unknown)[0]
        raise HintError(f"tenure.{name}", f"unknown hint field tenure.{name}")
    found: dict[str, Any] = {}
    for key in ("session", "session_id"):
        if key in obj:
            _once(found, "session", validate_id(f"tenure.{key}", obj[key]), f"tenure.{key}")
    if "last_turn" in obj:
        value = obj["last_turn"]
        if not isinstance(value, bool):
            raise HintError("tenure.last_turn", "tenure.last_turn must be true or false")
        found["last_turn"] = (value, "tenure.last_turn")
    if "reasoning" in obj:
        value = obj["reasoning"]
        if not isinstance(value, bool):
            raise HintError("tenure.reasoning", "tenure.reasoning must be true or false")
        found["reasoning"] = (value, "tenure.reasoning")
    for key, scale in (("expected_gap_ms", 0.001), ("expected_gap_s", 1.0)):
        if key in obj:
            param = f"tenure.{key}"
            _once(found, "expected_gap_s", _gap_seconds(param, obj[key], scale), param)
    for key in ("segment", "parent"):
        if key in obj:
            found[key] = (validate_id(f"tenure.{key}", obj[key]), f"tenure.{key}")
    return found


def _once(found: dict[str, Any], name: str, value: object, param: str) -> None:
    """Record one field given under one of its spellings; two spellings must agree."""
    if name in found and found[name][0] != value:
        raise HintError(param, f"{param} disagrees with {found[name][1]}")
    found[name] = (value, param)


def parse_hints(headers: Mapping[str, str], body_hints: object | None) -> Hints:
    """Merge header and body hints; raise :class:`HintError` naming the first bad field."""
    values = _from_headers(headers)
    if body_hints is not None:
        for name, (value, param) in _from_body(body_hints).items():
            if name in values and values[name][0] != value:
                raise HintError(param, f"{param} disagrees with header {values[name][1]}")
            values[name] = (value, param)
    if not values:
        return NO_HINTS
    return Hints(**{name: value for name, (value, _param) in values.items()})
