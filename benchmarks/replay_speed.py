"""Speed of one replay over the whole Claude Code trace: wall time and peak RSS per policy.

Same as ``tenure bench replay``; run ``python benchmarks/replay_speed.py [--policies lru,tenure]``.
"""

from __future__ import annotations

import sys

from service.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", "replay", *sys.argv[1:]]))
