"""Progress of a long replay when stderr is a log, not a terminal."""

from __future__ import annotations

import io

from tenure.service.replay.progress import ProgressBar


def test_a_log_gets_plain_lines_at_its_interval_and_one_at_the_end() -> None:
    quiet = io.StringIO()
    bar = ProgressBar("replay", stream=quiet, log_every_s=3600.0)
    bar.update(10, 100)
    bar.close()
    assert quiet.getvalue() == ""  # nothing before the interval, no bar codes in a log

    log = io.StringIO()
    bar = ProgressBar("replay", stream=log, log_every_s=0.0)
    bar.update(25, 100)
    bar.update(100, 100)
    bar.close()
    first, last = log.getvalue().splitlines()
    assert first.startswith("replay: 25.0% (25 of 100), ") and "left" in first
    assert last.startswith("replay: 100.0% (100 of 100), ") and "left" not in last
    assert "\r" not in log.getvalue()
