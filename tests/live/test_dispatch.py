"""The live A/B's one interleaving (issue 28): the dispatch plan, its gate, and the verdict.

No engine: the plan is checked against the simulator it is drawn from, the gate against a
scripted set of calls that become due out of order, the verdict on figures made up to sit on
either side of its rules.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from tenure.service.live.dispatch import ClosedLoop, DispatchPlan, Gate, plan_dispatch
from tenure.service.live.verdict import say_verdict, verdict

TRACE = Path(__file__).resolve().parents[3] / "shared/traces/claude_code/sessions.jsonl.gz"
if not TRACE.is_file():
    TRACE = Path("/work/shared/traces/claude_code/sessions.jsonl.gz")


def _quick_slice() -> tuple[Any, Any, list[tuple[float, int]]]:
    from tenure.service.live.cli import ENGINE_DEFAULTS, QUICK, _load_slice
    from tenure.service.live.workload import SliceSpec, arrival_schedule, engine_trace

    sessions, turns, rate, scale, gap, _budget = QUICK
    spec = SliceSpec(
        TRACE, sessions=sessions, max_turns=turns, time_scale=scale, max_gap_s=gap,
        max_prompt_tokens=ENGINE_DEFAULTS["max_model_len"] - 32,
    )  # fmt: skip
    work = _load_slice(TRACE, spec)
    etrace = engine_trace(work, ENGINE_DEFAULTS["block_tokens"])
    return work, etrace, arrival_schedule(etrace.roots, rate, 0)


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Claude Code trace is not here")
def test_plan_replays_the_simulated_runs_order() -> None:
    """The plan, drawn from a simulated arm's completion times, finishes the calls in the order
    the simulator itself finished them: the driver's closed loop is the simulator's."""
    from tenure.service.live.profiles import engine_profile
    from tenure.service.live.simulated import run_simulated

    work, etrace, schedule = _quick_slice()
    run = run_simulated(
        etrace, "lru", engine_profile("demo"), gpu_blocks=80, host_blocks=40, arrival_rate=1.0,
        seed=0,
    )  # fmt: skip
    keys = list(zip(run.turn_session, run.turn_index, strict=True))
    plan = plan_dispatch(work, schedule, dict(zip(keys, run.jct_s, strict=True)))
    assert len(plan.sent) == len(plan.finished) == work.turns
    assert list(plan.finished) == keys
    # Every call was sent after its own session's previous one finished.
    done_at = {key: i for i, key in enumerate(plan.finished)}
    for session, turn in plan.sent:
        if turn:
            assert done_at[(session, turn - 1)] < plan.finished_before[(session, turn)]


@pytest.mark.skipif(not TRACE.is_file(), reason="the shared Claude Code trace is not here")
def test_the_simulator_holds_its_arms_to_the_plan_as_the_live_gate_does() -> None:
    """Paced by the plan drawn from its own free run, an arm replays that run call for call;
    two arms paced side by side send every call at one moment, in the plan's order, and
    the arm whose calls finish sooner is held to the other's pace (on the demo slice it then
    computes ~15% more tokens than run freely, as the live arm does: issue 28's gap)."""
    from tenure.service.live.profiles import engine_profile
    from tenure.service.live.report import simulated_arm
    from tenure.service.live.simulated import run_paced, run_simulated

    work, etrace, schedule = _quick_slice()
    kw: dict[str, Any] = dict(gpu_blocks=80, host_blocks=40, arrival_rate=1.0, seed=0)
    profile = engine_profile("demo")
    free = {n: run_simulated(etrace, n, profile, **kw) for n in ("lru", "tenure")}
    base = free["lru"]
    keys = list(zip(base.turn_session, base.turn_index, strict=True))
    plan = plan_dispatch(work, schedule, dict(zip(keys, base.jct_s, strict=True)))

    (alone,) = run_paced(etrace, ["lru"], profile, plan, **kw)
    for name in ("turn_session", "turn_index", "arrival_s", "jct_s", "prefill_tokens"):
        assert list(getattr(alone, name)) == list(getattr(base, name)), name

    lru, tenure = run_paced(etrace, ["lru", "tenure"], profile, plan, **kw)
    sent = {}
    for run in (lru, tenure):
        at = {
            (int(s), int(k)): a
            for s, k, a in zip(run.turn_session, run.turn_index, run.arrival_s, strict=True)
        }
        assert sorted(at, key=lambda key: (at[key], plan.rank()[key])) == list(plan.sent)
        sent[run.policy] = at
    assert sent["lru"] == sent["tenure"]
    # Held to lru's pace, tenure's run is as long as lru's, not shorter as it is freely.
    assert tenure.last_completion_s >= lru.last_completion_s > free["tenure"].last_completion_s
    assert simulated_arm(tenure, etrace)["turns"] == work.turns


def test_a_paced_call_the_plan_does_not_know_is_an_error() -> None:
    from tenure.service.replay.pacing import GateRule

    rule = GateRule(_toy_plan())
    assert not rule.knows((9, 9)) and rule.knows((0, 0))
    with pytest.raises(ValueError, match="arms"):
        GateRule(_toy_plan(), arms=0)


def _toy_plan() -> DispatchPlan:
    # Five calls: a and b overlap; c goes once a finished; d once a and b finished; e last.
    a, b, c, d, e = (0, 0), (1, 0), (0, 1), (1, 1), (0, 2)
    return DispatchPlan(
        sent=(a, b, c, d, e),
        finished=(a, b, c, d, e),
        finished_before={a: 0, b: 0, c: 1, d: 2, e: 4},
    )


def test_gate_sends_in_plan_order_whatever_order_calls_become_due() -> None:
    """Calls due in a shuffled order with random service times still go out in the plan's
    order, each after what the plan had finished before it."""
    plan = _toy_plan()

    async def play(seed: int) -> list[tuple[str, tuple[int, int]]]:
        rng = random.Random(seed)
        gate = Gate(plan, patience_s=10)
        log: list[tuple[str, tuple[int, int]]] = []

        async def call(key: tuple[int, int]) -> None:
            await asyncio.sleep(rng.random() * 0.02)  # due in a random order
            await gate.enter(key)
            log.append(("sent", key))
            await asyncio.sleep(rng.random() * 0.02)
            log.append(("done", key))
            gate.done(key)

        await asyncio.gather(*(call(k) for k in plan.sent))
        assert gate.forced == 0
        return log

    for seed in range(20):
        log = asyncio.run(play(seed))
        sent = [k for kind, k in log if kind == "sent"]
        assert sent == list(plan.sent)
        for key in plan.sent:
            at = log.index(("sent", key))
            finished = {k for kind, k in log[:at] if kind == "done"}
            assert set(plan.finished[: plan.finished_before[key]]) <= finished


def test_a_shared_gate_sends_each_call_to_both_arms_together() -> None:
    """Side by side (one gate, two arms): a call goes out in both arms at once, whichever arm
    has it due first, and counts as finished only once both arms finished it."""
    plan = _toy_plan()

    async def play(seed: int) -> list[tuple[str, int, tuple[int, int]]]:
        rng = random.Random(seed)
        gate = Gate(plan, patience_s=10, arms=2)
        log: list[tuple[str, int, tuple[int, int]]] = []

        async def call(arm: int, key: tuple[int, int]) -> None:
            await asyncio.sleep(rng.random() * 0.02)  # each arm has it due at its own time
            await gate.enter(key)
            log.append(("sent", arm, key))
            # Arm 1 answers ten times slower: arm 0 must not run ahead of it.
            await asyncio.sleep(rng.random() * 0.002 * (1 + 9 * arm))
            log.append(("done", arm, key))
            gate.done(key)

        await asyncio.gather(*(call(arm, k) for k in plan.sent for arm in (0, 1)))
        assert gate.forced == 0
        return log

    for seed in range(20):
        log = asyncio.run(play(seed))
        sends = [(arm, k) for kind, arm, k in log if kind == "sent"]
        # Pairs: both arms' sends of a call come before either arm sends the next one.
        assert [k for _arm, k in sends] == [k for k in plan.sent for _ in (0, 1)]
        for key in plan.sent:
            first = min(i for i, e in enumerate(log) if e[0] == "sent" and e[2] == key)
            done_both = {
                k for k in plan.sent if sum(1 for e in log[:first] if e[::2] == ("done", k)) == 2
            }
            assert set(plan.finished[: plan.finished_before[key]]) <= done_both


def test_gate_lets_a_call_go_at_its_patience_limit() -> None:
    """A plan the run cannot follow (a call that is never sent) does not hang the others."""
    plan = _toy_plan()

    async def play() -> int:
        gate = Gate(plan, patience_s=0.05)
        await gate.enter((1, 0))  # (0, 0) never comes
        return gate.forced

    assert asyncio.run(play()) == 1


def test_cancelling_a_run_cancels_its_held_calls() -> None:
    """A run stopped by the user (Ctrl-C cancels asyncio's main task) does not hang on calls
    the plan is holding."""
    plan = _toy_plan()

    async def play() -> bool:
        gate = Gate(plan, patience_s=60)
        held = asyncio.ensure_future(gate.enter((0, 2)))  # needs four calls finished first
        await asyncio.sleep(0.01)
        held.cancel()
        try:
            await asyncio.wait_for(held, 1.0)
        except asyncio.CancelledError:
            return True
        return False

    assert asyncio.run(play())


def test_closed_loop_waits_for_the_gap_after_the_answer() -> None:
    from tenure.service.live.workload import LiveSession, LiveTurn, SliceSpec, Workload

    turn = LiveTurn(gap_s=0.5, words=(1, 2), tool=True, answer_words=0, last=False)
    last = LiveTurn(gap_s=0.25, words=(1, 2, 3), tool=False, answer_words=2, last=True)
    work = Workload(SliceSpec(TRACE), [LiveSession("s", "s", (turn, last))])
    loop = ClosedLoop(work)
    assert loop.started(0, 1.0) == []
    assert loop.done(0, 0, 2.0) == [(2.25, 0, 1)]
    assert loop.done(0, 1, 3.0) == []


def _arms(host: tuple[float, float], gpu: tuple[int, int], cached_host: tuple[int, int]) -> Any:
    return {
        name: {
            "host_hit_rate": host[i],
            "prompt_tokens_computed": 10_000 - cached_host[i] - gpu[i],
            "prompt_tokens_cached_gpu": gpu[i],
            "prompt_tokens_cached_host": cached_host[i],
        }
        for i, name in enumerate(("lru", "tenure"))
    }


def test_verdict_names_a_winner_only_where_the_interval_excludes_zero() -> None:
    live = _arms((0.10, 0.30), (5_000, 5_000), (500, 2_000))
    separated = {
        "total_computed_tokens": [-1_500.0, -2_000.0, -1_000.0],
        "mean_resumed_ttft_s": [-0.050, -0.080, -0.020],
        "mean_jct_s": [-0.010, -0.040, 0.020],
    }
    rows = {r["figure"]: r for r in verdict(live, separated, ["lru", "tenure"])}
    assert rows["host_hit_rate"]["better"] == "tenure"
    assert rows["prompt_tokens_computed"]["better"] == "tenure"
    assert rows["resumed_ttft"]["better"] == "tenure"
    assert rows["turn_completion"]["better"] is None
    for row in rows.values():  # a figure is either given to an arm or said not separated
        assert (row["better"] is not None) != bool(row["why_not_separated"]), row
    said = say_verdict(list(rows.values()), ["lru", "tenure"])
    assert any("turn completion" in s and "not separated" in s for s in said)

    # Slower, with an interval above 0: the control arm is ahead.
    slower = {**separated, "mean_resumed_ttft_s": [0.050, 0.020, 0.080]}
    rows = {r["figure"]: r for r in verdict(live, slower, ["lru", "tenure"])}
    assert rows["resumed_ttft"]["better"] == "lru"

    # Tokens spanning 0: neither tokens nor hits are separated.
    spanning = {**separated, "total_computed_tokens": [-100.0, -900.0, 700.0]}
    rows = {r["figure"]: r for r in verdict(live, spanning, ["lru", "tenure"])}
    assert rows["prompt_tokens_computed"]["better"] is None
    assert rows["host_hit_rate"]["better"] is None


def test_verdict_does_not_credit_the_host_tier_with_the_prefix_caches_moves() -> None:
    """When the engine's own prefix cache moved more tokens between the arms than the host
    tier did, the interleaving differed: the hit rates are not separated."""
    live = _arms((0.10, 0.30), (3_000, 6_000), (500, 2_000))
    delta = {"total_computed_tokens": [-4_500.0, -5_000.0, -4_000.0]}
    rows = {r["figure"]: r for r in verdict(live, delta, ["lru", "tenure"])}
    assert rows["host_hit_rate"]["better"] is None
    assert "prefix cache" in rows["host_hit_rate"]["why_not_separated"]
