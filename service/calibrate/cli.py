"""``tenure calibrate --engine URL``: measure the price vector, print it, optionally apply it.

``--write-sidecar URL --admin-token TOKEN`` (or ``TENURE_ADMIN_TOKEN``) PATCHes the vector into
the running sidecar's ``/admin/config``; the sidecar validates it (422 names the field) and
nothing changes unless it is accepted. Every problem (engine not there, not vLLM, no host tier,
an unusable measurement, a refused PATCH) is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError

__all__ = ["configure"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine", required=True, help="vLLM OpenAI server, e.g. http://h:8000")
    parser.add_argument("--repeats", default="5", help="measurements per quantity (median)")
    parser.add_argument("--ranks", default="1", help="GPUs a second is charged over (TP size)")
    parser.add_argument("--prefix-tokens", default=None, help="shared prefix length (tokens)")
    parser.add_argument("--suffix-tokens", default=None, help="private suffix length (tokens)")
    parser.add_argument(
        "--footprint-tokens", default=None,
        help="charge alpha1 for this many tokens per suspended context (default: measured)",
    )  # fmt: skip
    parser.add_argument(
        "--beta2", default=None,
        help="use this host-resume allowance (GPU-s) instead of measuring it (seed: 0.02)",
    )  # fmt: skip
    parser.add_argument("--timeout", default="120", help="per-request timeout, seconds")
    parser.add_argument("--json", type=Path, default=None, help="write the measurement here")
    parser.add_argument(
        "--write-sidecar", default=None, help="sidecar URL to PATCH the vector into"
    )
    parser.add_argument(
        "--admin-token", default=None, help="sidecar admin token (default: $TENURE_ADMIN_TOKEN)"
    )
    parser.set_defaults(func=run)


def _int(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{name} must be a whole number, got {text!r}") from None
    if value < 1:
        raise UsageError(f"{name} must be >= 1, got {text!r}")
    return value


def _float(text: str | None, name: str, *, allow_zero: bool) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise UsageError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number")
    return value


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _fmt(spread: Any) -> str:
    if spread is None:
        return "-"
    return (
        f"median {spread.median * 1e3:.1f} ms  [min {spread.low * 1e3:.1f}, "
        f"max {spread.high * 1e3:.1f}; n={len(spread.values)}]"
    )


def report(cal: Any) -> str:
    price = cal.price
    lines = [
        f"engine {cal.engine} model {cal.model}: KV pool {cal.pool_tokens} tokens "
        f"({cal.block_tokens}-token blocks), ranks charged {cal.plan.ranks}",
        f"probe: shared prefix {cal.plan.prefix_tokens} + private suffix "
        f"{cal.plan.suffix_tokens} tokens, {cal.plan.repeats} repeats",
        f"  suffix re-prefill, prefix cached : {_fmt(cal.recompute_s)}",
        f"  resume resident in HBM           : {_fmt(cal.hbm_resume_s)}",
        f"  resume from the host tier        : {_fmt(cal.host_resume_s)}"
        + (f" ({cal.host_restored_tokens:.0f} tokens restored)" if cal.host_resume_s else ""),
        f"  host resume - HBM resume         : {_fmt(cal.host_extra_s)}",
        f"  suspended footprint              : {cal.footprint_tokens:.0f} tokens",
        f"price vector: alpha1 = {price.alpha1:.6g} GPU-s/s, beta2 = {price.beta2:.6g} GPU-s, "
        f"beta3 = {price.beta3:.6g} GPU-s",
        f"break-evens: t1 = beta2/alpha1 = {price.t1:.4g} s, t* = beta3/alpha1 = "
        f"{price.t_star:.4g} s",
    ]
    lines += [f"note: {n}" for n in cal.notes]
    return "\n".join(lines)


def write_sidecar(url: str, token: str, cal: Any, timeout_s: float) -> dict[str, Any]:
    """PATCH the price into ``/admin/config``; the sidecar's answer, or a one-line error."""
    import httpx

    body = {
        "price": {
            "alpha1_gpu_s_per_s": cal.price.alpha1,
            "beta2_gpu_s": cal.price.beta2,
            "beta3_gpu_s": cal.price.beta3,
        }
    }
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    target = url.rstrip("/") + "/admin/config"
    try:
        response = httpx.patch(target, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise UsageError(f"sidecar at {url} not reachable ({type(exc).__name__})") from None
    if response.status_code == 401:
        raise UsageError(f"sidecar at {url} refused the admin token (HTTP 401)")
    if response.status_code != 200:
        detail: Any = response.text[:300]
        try:
            errors = response.json().get("detail")
            if isinstance(errors, list) and errors:
                first = errors[0]
                detail = f"{'.'.join(str(p) for p in first.get('loc', []))}: {first.get('msg')}"
        except ValueError:
            pass
        raise UsageError(
            f"sidecar refused the price vector (HTTP {response.status_code}): {detail}"
        )
    doc: dict[str, Any] = response.json()
    return doc


def run(args: argparse.Namespace) -> int:
    from tenure.service.calibrate.engine import EngineError, EngineProbe
    from tenure.service.calibrate.procedure import calibrate, plan_for

    repeats = _int(args.repeats, "--repeats")
    ranks = _int(args.ranks, "--ranks")
    timeout = _float(args.timeout, "--timeout", allow_zero=False)
    beta2 = _float(args.beta2, "--beta2", allow_zero=True)
    prefix = _int(args.prefix_tokens, "--prefix-tokens")
    suffix = _int(args.suffix_tokens, "--suffix-tokens")
    footprint = _int(args.footprint_tokens, "--footprint-tokens")
    assert repeats is not None and ranks is not None and timeout is not None
    token = (
        args.admin_token
        if args.admin_token is not None
        else os.environ.get("TENURE_ADMIN_TOKEN", "")
    )
    if args.json is not None and not args.json.parent.is_dir():
        raise UsageError(f"{args.json}: the directory {args.json.parent} does not exist")
    probe = EngineProbe(args.engine, timeout_s=timeout)
    try:
        info = probe.discover()
        try:
            plan = plan_for(
                info, repeats=repeats, ranks=ranks, prefix_tokens=prefix, suffix_tokens=suffix,
                beta2_gpu_s=beta2, footprint_tokens=footprint,
            )  # fmt: skip
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        _say(
            f"calibrating {info.model} at {probe.url}: {plan.repeats} repeats of a "
            f"{plan.prefix_tokens}-token prefix + {plan.suffix_tokens}-token suffix"
        )
        cal = calibrate(probe, plan, _say)
    except EngineError as exc:
        raise UsageError(str(exc)) from None
    finally:
        probe.close()
    print(report(cal))
    if args.json is not None:
        args.json.write_text(json.dumps(cal.to_dict(), indent=1) + "\n", encoding="utf-8")
        _say(f"wrote {args.json}")
    if args.write_sidecar:
        config = write_sidecar(args.write_sidecar, token, cal, timeout)
        price = config.get("price", {})
        print(
            f"sidecar {args.write_sidecar}: config version {config.get('version')}, price "
            + ", ".join(f"{k}={v:.6g}" for k, v in price.items())
        )
    return 0
