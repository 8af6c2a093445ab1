"""The replay's GPU physics measured on a GPU: one short run, no vLLM, no network.

What the replay's roofline (:class:`tenure.service.replay.hardware.HardwareProfile`) models,
measured directly with PyTorch and transformers on the GPU it is about:

* **prefill**: a forward pass over ``n`` new tokens after ``c`` tokens of cached context, for a
  random-weight model with Llama-3.1-8B's exact configuration in bf16 (random weights run the
  same kernels on the same shapes as trained ones; only the logits differ). Only the last
  token's logits are computed, as vLLM does. Fit: ``t = overhead + flops / F`` with the
  roofline's FLOP count, so ``mfu = F / peak``.
* **decode**: one step of ``b`` sequences, one token each, over ``c`` tokens of context each
  (the KV cache filled with random values). Fit: ``t = overhead + bytes / B`` with the
  roofline's byte count (weights once per step plus the batch's KV), so
  ``hbm_efficiency = B / peak``.
* **host tier**: KV blocks in vLLM's layout (per layer ``(2, blocks, block_tokens, kv_heads,
  head_dim)``) copied between the GPU and pinned host memory the way vLLM's CPU offloading
  worker does (one copy per block, per K and V, per layer), for transfers of 1 .. 256 blocks at
  the adapter's block sizes. Fit per direction: ``t = latency + bytes / bandwidth``.

The public-spec figures (peak FLOP/s, HBM and PCIe bandwidth) stay the datasheet's; what is
measured is the efficiency of each, the step overhead and the per-transfer latency, which is
how the spec profiles state their assumptions. The result is a JSON profile file the replay
loads by name (``tenure replay --hardware h200-llama3-8b-measured``), with every raw timing.

``cpu_dry_run=True`` runs every step on a tiny shape on the CPU (the end-to-end check in the
test suite); its profile is named ``...-cpu-dry-run`` and describes nothing real.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GB = 1e9

__all__ = [
    "LLAMA31_8B_CONFIG",
    "TINY_CONFIG",
    "GpuProfilePlan",
    "fit_line",
    "measure_gpu_profile",
]

#: meta-llama/Llama-3.1-8B config.json (the fields that shape compute; vocabulary included
#: because the embedding and the last token's logits are part of every step).
LLAMA31_8B_CONFIG: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
#: The dry run's shape: every code path of the real run, seconds on a CPU.
TINY_CONFIG: dict[str, Any] = {
    **LLAMA31_8B_CONFIG,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
}


@dataclass(frozen=True, slots=True)
class GpuProfilePlan:
    """What to measure. The defaults fit in about 5 minutes on one H200 (8 at most)."""

    name: str = "h200-llama3-8b-measured"
    #: The spec profile whose public facts (peaks, memory, engine limits) the result keeps.
    spec_profile: str = "h200-llama3-8b"
    model_config: dict[str, Any] = field(default_factory=lambda: dict(LLAMA31_8B_CONFIG))
    device: str = "cuda"
    prefill_tokens: tuple[int, ...] = (128, 512, 2048, 8192)
    prefill_contexts: tuple[int, ...] = (0, 4096, 16384)
    decode_batches: tuple[int, ...] = (1, 8, 32, 64, 128)
    decode_contexts: tuple[int, ...] = (512, 2048, 8192)
    #: Largest batch x context of a decode point (KV memory: 128 KiB per token on the 8B).
    decode_max_tokens: int = 262144
    block_tokens: tuple[int, ...] = (16, 32)
    transfer_blocks: tuple[int, ...] = (1, 4, 16, 64, 256)
    repeats: int = 5
    warmup: int = 2

    @classmethod
    def cpu_dry_run(cls) -> GpuProfilePlan:
        return cls(
            name="h200-llama3-8b-measured-cpu-dry-run",
            model_config=dict(TINY_CONFIG),
            device="cpu",
            prefill_tokens=(8, 32),
            prefill_contexts=(0, 32),
            decode_batches=(1, 4),
            decode_contexts=(16, 64),
            decode_max_tokens=1024,
            block_tokens=(16,),
            transfer_blocks=(1, 4, 16),
            repeats=2,
            warmup=1,
        )


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: ``(a, b)``; ``b`` is 0 when all ``x`` are equal."""
    n = len(xs)
    if n == 0:
        raise ValueError("no points to fit")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


class _Timer:
    """Median wall time of a callable on ``device``, synchronising a GPU around each call."""

    def __init__(self, torch: Any, device: str, repeats: int, warmup: int) -> None:
        self._torch = torch
        self._cuda = device.startswith("cuda")
        self._repeats = repeats
        self._warmup = warmup

    def _sync(self) -> None:
        if self._cuda:
            self._torch.cuda.synchronize()

    def median(self, fn: Callable[[], object], before: Callable[[], object] | None = None) -> float:
        times: list[float] = []
        for i in range(self._warmup + self._repeats):
            if before is not None:
                before()
            self._sync()
            start = time.perf_counter()
            fn()
            self._sync()
            if i >= self._warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times)


def _model_facts(cfg: dict[str, Any]) -> dict[str, float]:
    """The roofline's model terms for ``cfg``, counted as ``tenure.service.replay.hardware``
    does."""
    h, inter, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv_heads, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    attn = h * heads * hd + 2 * h * kv_heads * hd + heads * hd * h
    mlp = 3 * h * inter
    matmul = layers * (attn + mlp) + h * cfg["vocab_size"]  # + the LM head (last token)
    params = matmul + h * cfg["vocab_size"]  # + the embedding table (read, not multiplied)
    return {
        "matmul_params": float(matmul),
        "params": float(params),
        "weight_bytes": float(params * 2),
        "layers": float(layers),
        "attention_width": float(heads * hd),
        "kv_bytes_per_token": float(2 * layers * kv_heads * hd * 2),
    }


def _build_model(torch: Any, plan: GpuProfilePlan) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**plan.model_config)
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(plan.device):
            model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def _empty_cache(plan: GpuProfilePlan, model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def _measure_prefill(
    torch: Any, model: Any, plan: GpuProfilePlan, timer: _Timer, say: Callable[[str], None]
) -> list[dict[str, float]]:
    vocab = plan.model_config["vocab_size"]
    points: list[dict[str, float]] = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for context in plan.prefill_contexts:
        cache = _empty_cache(plan, model)
        if context:
            ids = torch.randint(vocab, (1, context), generator=gen).to(plan.device)
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for tokens in plan.prefill_tokens:
            ids = torch.randint(vocab, (1, tokens), generator=gen).to(plan.device)
            pos = torch.arange(context, context + tokens, device=plan.device)[None]

            def step(ids: Any = ids, pos: Any = pos, cache: Any = cache) -> None:
                model(
                    input_ids=ids,
                    position_ids=pos,
                    cache_position=pos[0],
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )

            def rewind(cache: Any = cache, context: int = context) -> None:
                _rewind(cache, context)  # each repeat extends the same cached context

            seconds = timer.median(step, before=rewind)
            points.append({"tokens": tokens, "context": context, "seconds": seconds})
            say(f"prefill {tokens:>6} tokens after {context:>6}: {seconds * 1e3:9.3f} ms")
        del cache
    return points


def _rewind(cache: Any, context: int) -> None:
    """Cut ``cache`` back to its first ``context`` tokens (a negative crop removes tokens)."""
    extra = int(cache.get_seq_length()) - context
    if extra > 0:
        cache.crop(-extra)


def _random_cache(torch: Any, model: Any, plan: GpuProfilePlan, batch: int, context: int) -> Any:
    cfg = plan.model_config
    cache = _empty_cache(plan, model)
    shape = (batch, cfg["num_key_value_heads"], context, cfg["head_dim"])
    for layer in range(cfg["num_hidden_layers"]):
        k = torch.randn(shape, dtype=torch.bfloat16, device=plan.device)
        v = torch.randn(shape, dtype=torch.bfloat16, device=plan.device)
        cache.update(k, v, layer)
    return cache


def _measure_decode(
    torch: Any, model: Any, plan: GpuProfilePlan, timer: _Timer, say: Callable[[str], None]
) -> list[dict[str, float]]:
    vocab = plan.model_config["vocab_size"]
    points: list[dict[str, float]] = []
    for context in plan.decode_contexts:
        for batch in plan.decode_batches:
            if batch * context > plan.decode_max_tokens:
                continue
            cache = _random_cache(torch, model, plan, batch, context)
            ids = torch.randint(vocab, (batch, 1)).to(plan.device)
            pos = torch.full((batch, 1), context, device=plan.device)

            def step(ids: Any = ids, pos: Any = pos, cache: Any = cache) -> None:
                model(
                    input_ids=ids,
                    position_ids=pos,
                    cache_position=pos[0],
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )

            def rewind(cache: Any = cache, context: int = context) -> None:
                _rewind(cache, context)

            seconds = timer.median(step, before=rewind)
            points.append({"batch": batch, "context": context, "seconds": seconds})
            say(f"decode batch {batch:>4} x context {context:>6}: {seconds * 1e3:9.3f} ms")
            del cache
    return points


def _measure_transfers(
    torch: Any, plan: GpuProfilePlan, timer: _Timer, say: Callable[[str], None]
) -> list[dict[str, Any]]:
    """GPU <-> pinned-host copies of KV blocks in vLLM's per-layer layout, one copy per block
    per K/V per layer (how vLLM's CPU offloading worker moves them)."""
    cfg = plan.model_config
    layers, kv_heads, hd = cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]
    pin = plan.device.startswith("cuda")
    most = max(plan.transfer_blocks)
    points: list[dict[str, Any]] = []
    for block_tokens in plan.block_tokens:
        shape = (2, most, block_tokens, kv_heads, hd)
        gpu = [torch.randn(shape, dtype=torch.bfloat16, device=plan.device) for _ in range(layers)]
        host = [torch.empty(shape, dtype=torch.bfloat16, pin_memory=pin) for _ in range(layers)]
        block_bytes = 2 * layers * block_tokens * kv_heads * hd * 2
        for n in plan.transfer_blocks:

            def store(n: int = n, gpu: list[Any] = gpu, host: list[Any] = host) -> None:
                for g, c in zip(gpu, host, strict=True):
                    for b in range(n):
                        c[0, b].copy_(g[0, b], non_blocking=pin)
                        c[1, b].copy_(g[1, b], non_blocking=pin)

            def load(n: int = n, gpu: list[Any] = gpu, host: list[Any] = host) -> None:
                for g, c in zip(gpu, host, strict=True):
                    for b in range(n):
                        g[0, b].copy_(c[0, b], non_blocking=pin)
                        g[1, b].copy_(c[1, b], non_blocking=pin)

            for direction, fn in (("store", store), ("load", load)):
                seconds = timer.median(fn)
                points.append(
                    {
                        "direction": direction,
                        "block_tokens": block_tokens,
                        "blocks": n,
                        "bytes": float(n * block_bytes),
                        "seconds": seconds,
                    }
                )
                say(
                    f"{direction:<5} {n:>4} blocks of {block_tokens} tokens: "
                    f"{seconds * 1e3:9.3f} ms ({n * block_bytes / seconds / GB:7.2f} GB/s)"
                )
        del gpu, host
    return points


def _fits(
    facts: dict[str, float],
    prefill: list[dict[str, float]],
    decode: list[dict[str, float]],
    transfers: list[dict[str, Any]],
) -> dict[str, float]:
    layers, width = facts["layers"], facts["attention_width"]
    flops = [
        2 * facts["matmul_params"] * p["tokens"]
        # attention: each new token attends to the context plus the new tokens before it
        + 4 * layers * width * p["tokens"] * (p["context"] + (p["tokens"] + 1) / 2)
        for p in prefill
    ]
    pre_overhead, pre_slope = fit_line(flops, [p["seconds"] for p in prefill])
    moved = [facts["weight_bytes"] + facts["kv_bytes_per_token"] * d["batch"] * d["context"]
             for d in decode]  # fmt: skip
    dec_overhead, dec_slope = fit_line(moved, [d["seconds"] for d in decode])
    out = {
        "prefill_overhead_s": pre_overhead,
        "effective_flops": 1.0 / pre_slope if pre_slope > 0 else math.inf,
        "decode_overhead_s": dec_overhead,
        "effective_hbm_bandwidth": 1.0 / dec_slope if dec_slope > 0 else math.inf,
    }
    for direction in ("store", "load"):
        pts = [t for t in transfers if t["direction"] == direction]
        latency, slope = fit_line([t["blocks"] for t in pts], [t["seconds"] for t in pts])
        per_byte = fit_line([t["bytes"] for t in pts], [t["seconds"] for t in pts])[1]
        out[f"{direction}_latency_s"] = latency
        out[f"{direction}_seconds_per_block_copy"] = slope
        out[f"{direction}_bandwidth"] = 1.0 / per_byte if per_byte > 0 else math.inf
    return out


def measure_gpu_profile(
    plan: GpuProfilePlan,
    spec: Mapping[str, Any],
    say: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Run every measurement of ``plan`` and return the profile document (see module doc).

    ``spec``: the public-spec profile's fields (``plan.spec_profile``, a replay
    ``HardwareProfile`` as a dict); the result keeps its facts and replaces its efficiencies.
    """
    import torch

    if plan.device.startswith("cuda") and not torch.cuda.is_available():
        from tenure.service.errors import UsageError

        raise UsageError("no CUDA device: run on a GPU host, or use --cpu-dry-run")
    started = time.perf_counter()
    torch.manual_seed(0)
    timer = _Timer(torch, plan.device, plan.repeats, plan.warmup)
    facts = _model_facts(plan.model_config)
    with torch.inference_mode():
        model = _build_model(torch, plan)
        say(f"model: {facts['params'] / 1e9:.3f} B parameters, bf16, on {plan.device}")
        prefill = _measure_prefill(torch, model, plan, timer, say)
        decode = _measure_decode(torch, model, plan, timer, say)
        del model
        if plan.device.startswith("cuda"):
            torch.cuda.empty_cache()
        transfers = _measure_transfers(torch, plan, timer, say)
    fits = _fits(facts, prefill, decode, transfers)
    device_name = (
        torch.cuda.get_device_name(0) if plan.device.startswith("cuda") else "cpu (dry run)"
    )
    profile = dict(spec)
    load_bw = fits["load_bandwidth"]
    profile.update(
        name=plan.name,
        description=f"measured on {device_name}: {spec['description']}",
        # Public peaks stay; the measured part is how much of each the kernels reach.
        mfu=min(1.0, fits["effective_flops"] / spec["bf16_dense_flops_per_gpu"]),
        hbm_efficiency=min(1.0, fits["effective_hbm_bandwidth"] / spec["hbm_bandwidth_per_gpu"]),
        pcie_efficiency=min(1.0, load_bw / spec["pcie_bandwidth_per_gpu"]),
        step_overhead_s=max(0.0, fits["decode_overhead_s"]),
        transfer_latency_s=max(0.0, fits["load_latency_s"]),
    )
    return {
        "format": "tenure-hardware-profile/1",
        "profile": profile,
        "fits": fits,
        "model": {"config": plan.model_config, **facts},
        "measurements": {"prefill": prefill, "decode": decode, "transfers": transfers},
        "environment": {
            "device": device_name,
            "torch": torch.__version__,
            "dry_run": not plan.device.startswith("cuda"),
            "seconds": time.perf_counter() - started,
        },
    }


def write_profile(document: dict[str, Any], directory: Path) -> Path:
    path = directory / f"{document['profile']['name']}.json"
    path.write_text(json.dumps(document, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path
