"""How fast the engine ran during an arm, beside the speed its hardware profile assumes.

The simulated columns are the profile's physics: where the live engine ran much slower than
the profile (a loaded machine: calibration under load measured 3.5x the step overhead), calls
overlap more in the small pool, fewer prefix hits survive, and the simulator's figures are out
of the regime they were calibrated in. So each arm reports the speeds vLLM's own timers saw
(the same timers ``tenure calibrate-profile`` reads) and what the profile predicts for the
same work:

* prefill: prompt tokens computed / the sum of the requests' prefill times (first scheduled to
  first token); the profile's figure is one step over the arm's mean computed tokens per
  request, attending to its mean cached context. Prefills that share a step count that step
  once each, so a busy engine's figure is a lower bound;
* decode: the requests' decode time (first token to last) / their output tokens after the
  first; the profile's figure is the same ratio in the simulated arm (completion - first
  token, over the same calls' output tokens after the first), so decode steps shared with
  other calls' prefills count alike on both sides.

A speed more than :data:`REGIME_FACTOR` times off the profile's, either way, is flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tenure.service.calibrate.block_costs import BlockCosts
from tenure.service.live.arm import sum_metric
from tenure.service.replay.hardware import HardwareProfile
from tenure.service.replay.model import Trace
from tenure.service.replay.results import RunResult

__all__ = [
    "REGIME_FACTOR",
    "block_costs",
    "engine_speed",
    "engine_speeds",
    "out_of_regime",
    "profile_block_costs",
    "simulated_decode_step",
]

#: How far (either way) a live speed may be from the profile's before the simulated columns
#: are flagged as out of their calibrated regime.
REGIME_FACTOR = 2.0
_BY_SOURCE = "vllm:prompt_tokens_by_source_total"


def simulated_decode_step(run: RunResult, trace: Trace) -> float | None:
    """Seconds per output token after the first in a simulated arm (``None``: no decode)."""
    seconds = 0.0
    tokens = 0
    for i, session in enumerate(run.turn_session):
        extra = trace.sessions[session].turns[run.turn_index[i]].output_tokens - 1
        if extra > 0:
            seconds += run.jct_s[i] - run.ttft_s[i]
            tokens += extra
    return seconds / tokens if tokens else None


def engine_speed(
    engine: Mapping[str, float], profile: HardwareProfile, simulated_decode_s: float | None
) -> dict[str, Any]:
    """The arm's measured speeds and the profile's for the same work (``None`` where the
    engine's metrics had nothing to measure); ``simulated_decode_s`` is
    :func:`simulated_decode_step` of the arm's simulated run."""
    computed = sum_metric(engine, _BY_SOURCE, source="local_compute")
    cached = sum_metric(engine, _BY_SOURCE, source="local_cache_hit") + sum_metric(
        engine, _BY_SOURCE, source="external_kv_transfer"
    )
    requests = sum_metric(engine, "vllm:request_prefill_time_seconds_count")
    prefill_s = sum_metric(engine, "vllm:request_prefill_time_seconds_sum")
    decode_s = sum_metric(engine, "vllm:request_decode_time_seconds_sum")
    # Every request's first output token comes out of its prefill step.
    decoded = sum_metric(engine, "vllm:generation_tokens_total") - requests
    out: dict[str, Any] = {
        "prefill_tokens_per_s": None,
        "profile_prefill_tokens_per_s": None,
        "decode_step_s": None,
        "profile_decode_step_s": None,
        "requests": int(requests),
    }
    if requests <= 0:
        return out
    new = computed / requests
    context = cached / requests
    if prefill_s > 0 and new >= 1:
        out["prefill_tokens_per_s"] = computed / prefill_s
        tokens = max(1, round(new))
        step = profile.step_seconds(tokens, tokens * (context + tokens / 2), context + tokens)
        out["profile_prefill_tokens_per_s"] = tokens / step
    if decode_s > 0 and decoded > 0:
        out["decode_step_s"] = decode_s / decoded
        out["profile_decode_step_s"] = simulated_decode_s
    return out


def out_of_regime(speed: Mapping[str, Any]) -> list[str]:
    """What is more than :data:`REGIME_FACTOR` times off the profile, in words (empty: none)."""
    said: list[str] = []
    live, model = speed.get("prefill_tokens_per_s"), speed.get("profile_prefill_tokens_per_s")
    if live and model and not 1 / REGIME_FACTOR <= live / model <= REGIME_FACTOR:
        said.append(
            f"prefill {live:,.0f} tokens/s against the profile's {model:,.0f} "
            f"({model / live:.1f}x slower)"
            if live < model
            else f"prefill {live:,.0f} tokens/s against the profile's {model:,.0f} "
            f"({live / model:.1f}x faster)"
        )
    live, model = speed.get("decode_step_s"), speed.get("profile_decode_step_s")
    if live and model and not 1 / REGIME_FACTOR <= live / model <= REGIME_FACTOR:
        said.append(
            f"decode step {live * 1e3:.1f} ms against the profile's {model * 1e3:.1f} ms "
            f"({live / model:.1f}x)"
        )
    return said


def profile_block_costs(
    profile: HardwareProfile, block_tokens: int, context_blocks: int
) -> BlockCosts:
    """:class:`~tenure.service.calibrate.block_costs.BlockCosts` from a simulator profile's physics,
    defined as the measurement is: one step prefilling a whole ``context_blocks`` context minus
    one step serving it from the cache (one new token attending to it), and the context's KV
    bytes over the host -> device link, per block; the TTFTs are the prefill step, and the load
    plus the cached step."""
    n = block_tokens * context_blocks
    fresh = profile.step_seconds(n, n * (n + 1) / 2, n)
    cached = profile.step_seconds(1, n, n)
    load = n * profile.kv_bytes_per_token / profile.load_bandwidth()
    return BlockCosts(
        block_tokens,
        context_blocks,
        (fresh - cached) / context_blocks,
        load / context_blocks,
        notes=[f"the {profile.name} profile's roofline (not measured)"],
        ttft_fresh_s=fresh,
        ttft_host_s=load + cached,
    )


def engine_speeds(
    results: Mapping[str, Any],
    sims: Mapping[str, RunResult],
    etrace: Trace,
    profile: HardwareProfile,
    say: Callable[[str], None],
) -> dict[str, Any]:
    """Each arm's engine speed beside the profile's; said, with a warning where the simulated
    columns are out of their calibrated regime."""
    speeds = {
        name: engine_speed(run.engine, profile, simulated_decode_step(sims[name], etrace))
        for name, run in results.items()
    }
    for name, speed in speeds.items():
        live, model = speed["prefill_tokens_per_s"], speed["profile_prefill_tokens_per_s"]
        if live and model:
            say(
                f"{name}: the engine prefilled {live:,.0f} tokens/s (profile {profile.name}: "
                f"{model:,.0f}); decode step "
                + (
                    f"{speed['decode_step_s'] * 1e3:.1f} ms "
                    f"(simulated {speed['profile_decode_step_s'] * 1e3:.1f} ms)"
                    if speed["decode_step_s"] and speed["profile_decode_step_s"]
                    else "not measured"
                )
            )
        off = out_of_regime(speed)
        speed["out_of_regime"] = bool(off)
        if off:
            say(
                f"warning: {name}'s engine ran more than {REGIME_FACTOR:g}x off the profile "
                f"({'; '.join(off)}): its simulated columns are out of their calibrated "
                "regime (slower: a loaded machine; faster: a profile measured on a busier "
                "one, see `tenure calibrate-profile`), compare them with care"
            )
    return speeds


def block_costs(
    results: Mapping[str, Any],
    etrace: Trace,
    profile: HardwareProfile,
    layout: str,
    cores: int = 0,
) -> dict[str, Any]:
    """What recomputing a KV block costs against loading it from the host tier, three ways:
    this run's engine timers, the layout's calibration (``tenure calibrate-profile``'s TTFT
    probe) and the H100 profile's physics at the slice's contexts in trace tokens."""
    from tenure.service.live.profiles import CALIBRATED_BLOCK_COSTS, calibration_key
    from tenure.service.replay.hardware import get_profile

    bt = etrace.block_tokens
    said: list[str] = []
    out: dict[str, Any] = {}
    # This run: prefill seconds per computed block (vLLM's per-request prefill timer, which a
    # busy engine stretches) against the offloading worker's load seconds per loaded block.
    prefill_s = computed = load_s = loaded = 0.0
    for run in results.values():
        e = run.engine
        prefill_s += sum_metric(e, "vllm:request_prefill_time_seconds_sum")
        computed += sum_metric(e, "vllm:prompt_tokens_by_source_total", source="local_compute")
        load_s += sum_metric(e, "vllm:kv_offload_load_time_total")
        loaded += sum_metric(e, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    if computed and loaded and load_s > 0:
        recompute, load = prefill_s / (computed / bt), load_s / (loaded / bt)
        out["this_run"] = {"recompute_s": recompute, "load_s": load, "ratio": recompute / load}
        said.append(
            f"recompute/load of a {bt}-token block, this run's engine timers: "
            f"{recompute * 1e3:.2f} / {load * 1e3:.3f} ms = {recompute / load:.0f}x (vLLM's "
            "prefill timer per computed block over the offloading worker's load time per "
            "loaded block; excludes the step a load waits for)"
        )
    calibrated = CALIBRATED_BLOCK_COSTS.get(calibration_key(layout, cores))
    if calibrated is not None:
        out["calibrated"] = calibrated
        on = f" --cpus {cores}" if cores else ""
        said.append(
            f"recompute/load, calibrated (`tenure calibrate-profile --layout {layout}{on}`, "
            f"{calibrated['machine']}): a {calibrated['context_blocks']}-block context's TTFT "
            f"recomputed / loaded from the host tier = {calibrated['ttft_fresh_s'] * 1e3:,.0f} "
            f"/ {calibrated['ttft_host_s'] * 1e3:,.0f} ms = {calibrated['ttft_ratio']:.1f}x"
        )
    own = profile_block_costs(profile, bt, 32)
    out["profile"] = own.to_dict()
    said.append(f"recompute/load, the {profile.name} profile: {own.describe()}")
    # The GPU at the slice's own contexts: each live token stands for a trace block.
    gpu = get_profile("h100-llama3-8b")
    resumed = sorted(t.input_tokens for s in etrace.sessions for t in s.turns[1:])
    if resumed:
        trace_tokens = resumed[len(resumed) // 2] * 64
        gpu_costs = profile_block_costs(gpu, 16, max(1, trace_tokens // 16))
        out["gpu_profile"] = {**gpu_costs.to_dict(), "context_tokens": trace_tokens}
        said.append(
            f"recompute/load, the {gpu.name} profile at the slice's median resumed context "
            f"({trace_tokens:,} trace tokens): {gpu_costs.describe()}"
        )
    out["said"] = said
    return out
