"""Flash write endurance: rated endurance, write-rate metering and projected device lifetime.

An SSD's datasheet rates its endurance either as total bytes written (TBW / PBW) or as drive
writes per day (DWPD) over the warranty period; the two are the same number:
``TBW = DWPD x capacity x 365 x warranty_years``. At a sustained write rate ``w`` (bytes/s) the
device lasts ``TBW / (w x seconds per year)`` years; that is *device-years*, compared with the
warranty. Pure: the clock is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SECONDS_PER_YEAR", "Endurance", "WriteRateMeter"]

#: Julian year: the unit every endurance rating is quoted against.
SECONDS_PER_YEAR = 365.25 * 86400.0


@dataclass(frozen=True, slots=True)
class Endurance:
    """A device's rated write endurance."""

    rated_bytes_written: float
    warranty_years: float

    def __post_init__(self) -> None:
        if not (self.rated_bytes_written > 0 and math.isfinite(self.rated_bytes_written)):
            raise ValueError("rated endurance must be a positive number of bytes")
        if not (self.warranty_years > 0 and math.isfinite(self.warranty_years)):
            raise ValueError("warranty_years must be positive")

    @classmethod
    def from_dwpd(cls, dwpd: float, capacity_bytes: float, warranty_years: float) -> Endurance:
        """Endurance from a drive-writes-per-day rating over the warranty period."""
        if not (dwpd > 0 and capacity_bytes > 0):
            raise ValueError("dwpd and capacity_bytes must be positive")
        return cls(dwpd * capacity_bytes * 365.0 * warranty_years, warranty_years)

    def scaled(self, factor: float) -> Endurance:
        """The same device family at ``factor`` x the capacity (endurance scales with it)."""
        return Endurance(self.rated_bytes_written * factor, self.warranty_years)

    def device_years(self, write_bytes_per_s: float) -> float:
        """Years until the rated endurance is used up at a sustained write rate."""
        if write_bytes_per_s <= 0:
            return math.inf
        return self.rated_bytes_written / (write_bytes_per_s * SECONDS_PER_YEAR)

    def outlasts_warranty(self, write_bytes_per_s: float) -> bool:
        return self.device_years(write_bytes_per_s) >= self.warranty_years


class WriteRateMeter:
    """Bytes written per second, exponentially weighted with half-life ``half_life_s``.

    Each observation adds bytes at a time; the rate is the decayed byte mass over the decayed
    elapsed time, so a meter that started recently is not biased towards zero.
    """

    def __init__(self, half_life_s: float = 3600.0) -> None:
        if not half_life_s > 0:
            raise ValueError("half_life_s must be positive")
        self._k = math.log(2.0) / half_life_s
        self._mass = 0.0
        self._weight = 0.0  # decayed elapsed seconds
        self._last: float | None = None
        self.total_bytes = 0.0

    def _decayed(self, now: float) -> tuple[float, float]:
        if self._last is None or now <= self._last:
            return self._mass, self._weight
        decay = math.exp(-self._k * (now - self._last))
        return self._mass * decay, self._weight * decay + (1.0 - decay) / self._k

    def observe(self, now: float, nbytes: float) -> None:
        if self._last is not None and now < self._last:
            now = self._last  # a late observation counts at the latest time seen
        self._mass, self._weight = self._decayed(now)
        self._mass += nbytes
        self._last = now
        self.total_bytes += nbytes

    def rate(self, now: float) -> float:
        """Bytes per second at ``now`` (0 before any time has passed); changes nothing."""
        mass, weight = self._decayed(now)
        return mass / weight if weight > 0 else 0.0
