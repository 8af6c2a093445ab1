"""The Mooncake trace format (kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl``).

One request per line: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
(chained ids of ``block_tokens``-token blocks, the last one possibly partial). There are no
session ids, so sessions are inferred by prefix chaining: a request whose full blocks extend
the *whole* block list of an earlier request's latest turn continues that session, provided the
extension reaches past the blocks shared by very many requests (a common system prompt is not a
conversation). Everything else starts a new session.

Timing: the trace records arrivals only, so a turn's gap is the arrival-to-arrival time since
the session's previous turn (it includes that turn's original service time); stop reasons are
unknown. Ids are global: one id space for the whole trace.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tenure.service.errors import TraceError
from tenure.service.replay.loaders._io import json_lines, require
from tenure.service.replay.model import SegmentBuilder, SegmentTable, Session, Trace, Turn, rle

__all__ = ["DEFAULT_BLOCK_TOKENS", "load_mooncake"]

#: Mooncake's published traces hash 512-token blocks.
DEFAULT_BLOCK_TOKENS = 512


def load_mooncake(
    path: Path,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    popular_min_requests: int | None = None,
) -> Trace:
    """Load and chain requests into sessions.

    ``popular_min_requests``: a block contained in at least this many requests is "shared by
    very many" (default: ``max(32, 1%`` of requests``)``).
    """
    rows: list[tuple[float, int, int, list[int], int]] = []
    for line_no, obj in json_lines(path):
        where = f"{path}:{line_no}"
        ts = require(obj, "timestamp", (int, float), where)
        n_in = require(obj, "input_length", int, where)
        n_out = require(obj, "output_length", int, where)
        ids = require(obj, "hash_ids", list, where)
        if ts < 0 or n_in < 0 or n_out < 0:
            raise TraceError(f"{where}: negative timestamp or length")
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TraceError(f"{where}: hash_ids must be integers")
        if len(ids) * block_tokens < n_in:
            raise TraceError(f"{where}: {len(ids)} hash_ids cannot cover {n_in} input tokens")
        rows.append((float(ts), line_no, n_in, ids, n_out))
    if not rows:
        raise TraceError(f"{path}: no requests in trace")
    rows.sort(key=lambda r: (r[0], r[1]))
    threshold = popular_min_requests or max(32, len(rows) // 100)
    fan_out: Counter[int] = Counter()
    for row in rows:
        fan_out.update(set(row[3]))

    # Session inference: tips[(last full block id, full length)] -> session number.
    tips: dict[tuple[int, int], int] = {}
    chains: list[list[tuple[float, int, int, list[int]]]] = []
    for ts, _line, n_in, ids, n_out in rows:
        full = ids[: n_in // block_tokens]
        popular = 0
        while popular < len(full) and fan_out[full[popular]] >= threshold:
            popular += 1
        owner = None
        for p in range(len(full), popular, -1):
            owner = tips.pop((full[p - 1], p), None)
            if owner is not None:
                break
        if owner is None:
            owner = len(chains)
            chains.append([])
        chains[owner].append((ts, n_in, n_out, full))
        if full:
            tips[(full[-1], len(full))] = owner

    trace = Trace(name=path.name, block_tokens=block_tokens)
    builder = SegmentBuilder(SegmentTable(trace.segment_owner))
    for number, chain in enumerate(chains):
        index = len(trace.sessions)
        turns: list[Turn] = []
        prev_ts = chain[0][0]
        for k, (ts, n_in, n_out, full) in enumerate(chain):
            context, seen = builder.resolve(rle(full), index)
            gap = 0.0 if k == 0 else max(0.0, (ts - prev_ts) / 1000.0)
            turns.append(Turn(gap, context, n_in, n_out, "unknown", seen, k == len(chain) - 1))
            prev_ts = ts
        trace.sessions.append(Session(f"mooncake-{number}", tuple(turns)))
    return trace
