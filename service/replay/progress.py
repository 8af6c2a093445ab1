"""Progress on stderr: a bar redrawn in place on a terminal, or one plain line at most every
``log_every_s`` seconds when stderr is a file or a pipe (a long ladder in a log or in CI said
nothing for an hour otherwise)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        width: int = 30,
        log_every_s: float = 30.0,
    ) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.enabled = self.stream.isatty()
        self.log_every_s = log_every_s
        self.start = time.monotonic()
        self._last = -1.0
        self._logged = self.start

    def update(self, done: int, total: int) -> None:
        if total <= 0:
            return
        now = time.monotonic()
        if not self.enabled:
            if now - self._logged >= self.log_every_s or (
                done >= total and self._logged > self.start
            ):
                self._logged = now
                elapsed = now - self.start
                left = (
                    f", ~{elapsed * (total - done) / done:.0f} s left" if 0 < done < total else ""
                )
                self.stream.write(
                    f"{self.label}: {min(1.0, done / total):.1%} ({done:,} of {total:,}), "
                    f"{elapsed:.0f} s{left}\n"
                )
                self.stream.flush()
            return
        if now - self._last < 0.2 and done < total:
            return
        self._last = now
        frac = min(1.0, done / total)
        filled = int(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = now - self.start
        self.stream.write(f"\r{self.label} [{bar}] {frac * 100:5.1f}% {elapsed:6.1f}s")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
