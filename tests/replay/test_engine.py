"""The engine model: determinism, references that bound every policy, token conservation."""

from __future__ import annotations

import pytest

from tenure.service.replay.config import ReplayConfig
from tenure.service.replay.engine import simulate
from tenure.service.replay.hardware import get_profile
from tenure.service.replay.model import Trace
from tenure.service.replay.results import RunResult

H100 = get_profile("h100-llama3-8b")
# A small, pressured point: a dozen real sessions arriving every ~2 minutes into an 8 GiB tier.
RATE = 1 / 120
HOST_GIB = 8.0


def _run(trace: Trace, policy: str, seed: int = 0, host: float = HOST_GIB) -> RunResult:
    return simulate(trace, ReplayConfig(policy, H100, host, RATE, seed))


def _hit_rate(run: RunResult) -> float:
    return sum(run.host_hit_tokens) / max(1, sum(run.reusable_tokens))


def test_same_seed_same_results_different_seed_differs(claude_small: Trace) -> None:
    a = _run(claude_small, "tenure", seed=3)
    b = _run(claude_small, "tenure", seed=3)
    c = _run(claude_small, "tenure", seed=4)
    assert list(a.jct_s) == list(b.jct_s)
    assert a.counters == b.counters and a.host_bytes_stored == b.host_bytes_stored
    assert list(a.jct_s) != list(c.jct_s)


def test_every_turn_replays_once(claude_small: Trace) -> None:
    run = _run(claude_small, "lru")
    expected = {(i, k) for i, s in enumerate(claude_small.sessions) for k in range(len(s.turns))}
    got = set(zip(run.turn_session, run.turn_index, strict=True))
    skipped = {(i, k) for i, k in expected if (i, k) not in got}
    assert len(got) == run.turns  # no turn twice
    assert run.sessions_skipped_oversize == len(
        {run_root for run_root in _roots(claude_small, skipped)}
    )
    assert all(t >= 0 for t in run.ttft_s)
    assert all(j >= t for j, t in zip(run.jct_s, run.ttft_s, strict=True))


def _roots(trace: Trace, pairs: set[tuple[int, int]]) -> set[int]:
    out = set()
    for i, _k in pairs:
        while trace.sessions[i].parent is not None:
            i = trace.sessions[i].parent  # type: ignore[assignment]
        out.add(i)
    return out


def test_tokens_are_conserved(claude_small: Trace) -> None:
    """Each prompt token is served from the GPU pool, the host tier, or prefilled: exactly once."""
    run = _run(claude_small, "tenure")
    for s, k, gpu, host, prefill in zip(
        run.turn_session,
        run.turn_index,
        run.gpu_hit_tokens,
        run.host_hit_tokens,
        run.prefill_tokens,
        strict=True,
    ):
        tokens = claude_small.sessions[s].turns[k].input_tokens
        cached = gpu + host
        assert prefill == tokens - min(cached, tokens - 1)


def test_notier_stores_nothing_and_infinite_bounds_every_policy(claude_small: Trace) -> None:
    notier = _run(claude_small, "notier")
    assert notier.host_bytes_stored == 0 and notier.host_bytes_loaded == 0
    assert sum(notier.host_hit_tokens) == 0
    assert notier.counters["refusals"] > 0
    infinite = _run(claude_small, "infinite")
    assert _hit_rate(infinite) == pytest.approx(1.0)  # every re-read block is still there
    for policy in ("lru", "tenure", "gate-only-literal", "oracle", "ttl"):
        run = _run(claude_small, policy)
        assert _hit_rate(run) <= _hit_rate(infinite) + 1e-12, policy
        assert sum(run.prefill_tokens) >= sum(infinite.prefill_tokens) - 1e-9, policy


def test_capacity_bounds_the_tier_and_lru_thrashes_under_pressure(claude_small: Trace) -> None:
    """With the live working set far above the tier, LRU's stores churn and the gate's stick."""
    lru = _run(claude_small, "lru")
    gate = _run(claude_small, "tenure")
    assert lru.p95_live_working_set_gib > 3 * HOST_GIB
    assert lru.host_bytes_stored > lru.host_bytes_loaded  # writes that are never read back
    assert _hit_rate(gate) > _hit_rate(lru)
    assert gate.counters["refusals"] > 0


def test_oversize_sessions_are_skipped_not_truncated(claude: Trace) -> None:
    """A session whose context cannot fit the GPU pool is left out whole (and counted)."""
    pool_tokens = H100.kv_pool_blocks(claude.block_tokens) * claude.block_tokens
    big = next(
        i
        for i in claude.roots
        if any(t.input_tokens > pool_tokens for t in claude.sessions[i].turns)
    )
    trace = claude.subset([big, claude.roots[1]])
    run = _run(trace, "lru")
    assert run.sessions_skipped_oversize == 1
    assert set(run.turn_root) == {
        i for i in trace.roots if trace.sessions[i].id != claude.sessions[big].id
    }
