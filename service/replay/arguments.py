"""Parsing the replay commands' numeric arguments, with one-line usage errors."""

from __future__ import annotations

import math

from tenure.service.errors import UsageError

__all__ = ["int_list", "number"]


def number(text: str, name: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if math.isnan(value) or math.isinf(value) or value < 0 or (positive and value == 0):
        kind = "positive" if positive else "non-negative"
        raise UsageError(f"{name} must be a {kind} number, got {text!r}")
    return value


def int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(
            f"{name} must be a comma-separated list of integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise UsageError(f"{name} must list non-negative integers, got {text!r}")
    return values
