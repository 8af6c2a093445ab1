"""``tenure calibrate-profile``: measure a simulator hardware profile on a live vLLM engine.

What the engine model (:mod:`tenure.service.replay.hardware`) needs, measured with the engine's own
clocks (vLLM's per-request ``prefill`` / ``decode`` time histograms and its offloading
worker's transfer counters, read from ``/metrics`` around each request, so HTTP and API-server
time are not counted):

* **step overhead**: the median decode step of one short sequence (a tiny model's step is all
  overhead: the roofline terms are microseconds);
* **memory bandwidth**: the growth of that decode step with the context it reads
  (``kv bytes per token x context / bandwidth``), from a long-context decode;
* **compute**: the effective FLOP/s that fits the prefill times of fresh prompts of several
  lengths to ``overhead + (2 x params x L + 2 x layers x width x L^2) / F`` (the roofline's own
  dense and attention terms) by least squares;
* **host copy bandwidth**: bytes / seconds of every host-tier load the offloading worker did
  (``vllm:kv_offload_load_bytes`` / ``..._time``), after a flood pushed a context out of the
  pool;
* **pools**: the KV pool and block size vLLM reports (``vllm:cache_config_info``).

Model shape (parameters, layers, KV bytes per token) and batch limits are facts of the engine's
configuration, given by the caller. Every figure is a median over ``repeats`` requests; the
machine's load shows in the spread, which is reported beside each.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tenure.service.calibrate.engine import EngineError, EngineProbe

__all__ = ["ModelShape", "ProfileMeasurement", "measure_profile"]

_DECODE = "vllm:request_decode_time_seconds"


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The served model as the roofline counts it."""

    params: float  # matmul parameters (2 FLOPs per token each)
    weight_bytes: float
    layers: int
    attention_width: int  # query heads x head_dim
    kv_bytes_per_token: int


@dataclass
class ProfileMeasurement:
    engine: str
    model: str
    block_tokens: int
    gpu_blocks: int
    step_overhead_s: float
    decode_step_long_s: float
    long_context_tokens: int
    memory_bandwidth: float
    effective_flops: float
    host_copy_bandwidth: float
    host_bytes_loaded: float
    prefill: list[tuple[int, float]] = field(default_factory=list)
    decode_steps: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _engine_seconds(probe: EngineProbe, name: str) -> tuple[float, float]:
    """``(sum, count)`` of one of vLLM's request histograms."""
    total = count = 0.0
    for line in probe._get("/metrics").text.splitlines():
        if line.startswith(f"{name}_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def _counter(probe: EngineProbe, name: str) -> float:
    total = 0.0
    for line in probe._get("/metrics").text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _complete(probe: EngineProbe, prompt: list[int], max_tokens: int) -> None:
    assert probe.info is not None
    body = {
        "model": probe.info.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    probe._post("/v1/completions", body)


def _timed(probe: EngineProbe, prompt: list[int], max_tokens: int, histogram: str) -> float:
    before, n0 = _engine_seconds(probe, histogram)
    _complete(probe, prompt, max_tokens)
    # The engine records the request's stats just after answering it.
    for _ in range(50):
        after, n1 = _engine_seconds(probe, histogram)
        if n1 > n0:
            return after - before
        time.sleep(0.02)
    raise EngineError(f"the engine recorded no {histogram} for a finished request")


def measure_profile(
    probe: EngineProbe,
    shape: ModelShape,
    *,
    repeats: int = 5,
    say: Callable[[str], None] = lambda _m: None,
) -> ProfileMeasurement:
    info = probe.info or probe.discover()
    notes: list[str] = []
    longest = min(info.max_model_len - 40, info.pool_tokens - 2 * info.block_tokens, 2048)
    if longest < 4 * info.block_tokens:
        raise EngineError("the engine's pool or max_model_len is too small to measure a profile")

    # Decode steps: one short sequence (overhead), one long one (+ the KV it reads).
    steps = 32

    def decode_step(context: int) -> float:
        seconds = _timed(
            probe, probe.tokens(context), steps + 1, "vllm:request_decode_time_seconds"
        )
        return seconds / steps

    short = [decode_step(16) for _ in range(repeats)]
    long_ctx = longest
    long = [decode_step(long_ctx) for _ in range(repeats)]
    overhead = statistics.median(short)
    long_step = statistics.median(long)
    extra = long_step - overhead
    if extra > 0:
        bandwidth = shape.kv_bytes_per_token * long_ctx / extra
    else:
        bandwidth = math.inf
        notes.append("a long-context decode step was not slower than a short one: memory "
                     "bandwidth not binding (set to infinity)")  # fmt: skip
    say(f"  decode step: {overhead * 1e3:.2f} ms (16-token context), {long_step * 1e3:.2f} ms "
        f"({long_ctx}-token context)")  # fmt: skip

    # Prefill of fresh prompts at several lengths.
    lengths = sorted({max(info.block_tokens, longest // d) for d in (8, 4, 2, 1)})
    prefill: list[tuple[int, float]] = []
    for length in lengths:
        times = [
            _timed(probe, probe.tokens(length), 1, "vllm:request_prefill_time_seconds")
            for _ in range(repeats)
        ]
        prefill.append((length, statistics.median(times)))
        say(f"  prefill {length:5d} tokens: {prefill[-1][1] * 1e3:.1f} ms")
    # t - overhead = x / F, x = 2 P L + 2 layers width L^2: least squares through the origin.
    xs = [
        2 * shape.params * n + 2 * shape.layers * shape.attention_width * n * n for n, _ in prefill
    ]
    ys = [max(0.0, t - overhead) for _n, t in prefill]
    slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
    if slope <= 0:
        raise EngineError("prefill time did not grow with the prompt: cannot fit compute")
    flops = 1.0 / slope

    # Host copies: a context, a flood that pushes it out of the pool, the context again.
    loaded0 = _counter(probe, "vllm:kv_offload_load_bytes_total")
    time0 = _counter(probe, "vllm:kv_offload_load_time_total")
    for _ in range(repeats):
        context = probe.tokens(min(longest, 8 * info.block_tokens) + 3)
        _complete(probe, context, 1)
        flood = max(info.block_tokens, longest)
        for _ in range(math.ceil((info.pool_tokens + info.block_tokens) / flood)):
            _complete(probe, probe.tokens(flood), 1)
        _complete(probe, context, 1)
    loaded = _counter(probe, "vllm:kv_offload_load_bytes_total") - loaded0
    seconds = _counter(probe, "vllm:kv_offload_load_time_total") - time0
    if loaded <= 0 or seconds <= 0:
        raise EngineError(
            "no host-tier load observed: is the engine running with a KV offloading "
            "connector and a host tier larger than one context?"
        )
    host_bw = loaded / seconds
    say(f"  host tier loads: {loaded / 1e6:.1f} MB in {seconds * 1e3:.1f} ms")
    return ProfileMeasurement(
        probe.url,
        info.model,
        info.block_tokens,
        info.gpu_blocks,
        overhead,
        long_step,
        long_ctx,
        bandwidth,
        flops,
        host_bw,
        loaded,
        prefill,
        short + long,
        notes,
    )
