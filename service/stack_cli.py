"""``tenure up``: the live A/B on real agent traffic (default), or a local stack and a demo.

By default (:mod:`tenure.service.live.cli`): a slice of the Claude Code trace is played through the
sidecar into a CPU vLLM with the adapter, once with the host tier under ``lru`` and once under
``tenure``, beside the simulator's replay of the same slice; the table of both (and ``--json``,
``--plot``) follows.

``--scripted``: Redis, the tiny random-weight model, a CPU vLLM server with the Tenure adapter
and the sidecar start locally (progress lines while they do); then an agent session runs
through the proxy with lifecycle hints: a tool-using turn, other clients' traffic that floods
the engine's KV pool, the agent's return (served from the host tier), a second session
suspended for approval, and the agent's declared end (its host blocks reclaimed at once). The
decisions the sidecar pushed and the adapter's counters from ``/metrics`` are printed, then
everything stops, unless ``--keep-running``. ``--no-demo`` starts the stack and nothing else.

SIGINT, SIGTERM and SIGHUP stop the whole stack (Redis, the sidecar, vLLM and its EngineCore;
in the A/B, the arm's stack and Prometheus) at any point, start-up included, and exit with
128 + the signal number. The handlers are set explicitly: a shell starts a background job with
SIGINT ignored, and Python's default SIGTERM kills the launcher without stopping its children
(each runs in its own process group).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = ["configure", "run_demo"]

#: The signals that stop the stack.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Stopped(BaseException):
    """Raised in the main thread by the first stop signal (a ``BaseException``, like
    ``KeyboardInterrupt``: nothing on the way catches it by accident)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _StopSignals:
    """Route stop signals to :class:`_Stopped` until :meth:`stopping`; restores the old ones."""

    def __init__(self) -> None:
        self._stopping = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            return  # already stopping: a second Ctrl-C must not cut the clean-up short
        self._stopping = True
        raise _Stopped(signum)

    def stopping(self) -> None:
        """The stack is being stopped: later signals are ignored until it is down."""
        self._stopping = True

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _say(line: str) -> None:
    print(f"tenure up: {line}", flush=True)


def _sum(samples: dict[str, float], name: str) -> float:
    """A metric's value summed over its label sets (vLLM labels by engine and model)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def _delta(after: dict[str, float], before: dict[str, float], name: str) -> float:
    return _sum(after, name) - _sum(before, name)


def run_demo(stack: Any) -> dict[str, float]:
    """The demo traffic; returns the figures it printed (for tests)."""
    from tenure.service.processes import http_json
    from tenure.service.tools.tiny_model import word_prompt

    engine_before = stack.engine_metrics()
    session = "demo-agent"
    history: list[dict[str, str]] = [{"role": "user", "content": word_prompt(1, 300)}]

    def turn(label: str, **hints: Any) -> None:
        started = time.perf_counter()
        reply = stack.chat(history, session=session, **hints)
        text = reply["choices"][0]["message"]["content"]
        history.append({"role": "assistant", "content": text})
        ms = (time.perf_counter() - started) * 1000
        _say(f"  {session} {label}: {len(text.split())} tokens back in {ms:.0f} ms")

    _say(f"agent session {session!r}: turn 1 (a tool call follows, expected gap 3 s)")
    turn("turn 1", expected_gap_ms=3000)
    history.append({"role": "user", "content": "tool result " + word_prompt(2, 20)})
    _say("other clients: 3 unrelated prompts flood the engine's own KV pool")
    for seed in (11, 12, 13):
        stack.chat([{"role": "user", "content": word_prompt(seed, 300)}])
    _say(f"agent session {session!r}: turn 2 returns after its tool call")
    hits_before = stack.engine_metrics()
    turn("turn 2", expected_gap_ms=3000)
    hits_after = stack.engine_metrics()

    approver = "demo-approval"
    stack.chat([{"role": "user", "content": word_prompt(21, 300)}], session=approver)
    suspended = http_json(
        "POST",
        f"{stack.proxy_url}/v1/sessions/{approver}/suspend",
        {"reason": "human approval", "expected_wait_s": 600},
    )
    ttl = suspended.get("host_ttl_s")
    _say(
        f"session {approver!r} suspended for approval: host copy "
        + ("kept (retain)" if ttl is None else f"discarded after {ttl:.0f} s (host TTL)")
    )
    ended = http_json("POST", f"{stack.proxy_url}/v1/sessions/{session}/end", {})
    _say(f"agent session {session!r} ended ({ended['state']}): its host blocks are reclaimed")
    stack.wait_metric(
        'tenure_adapter_evicted_blocks_total{class="reclaim"}', lambda v: v > 0, timeout=20
    )

    decisions = http_json("GET", f"{stack.proxy_url}/admin/decisions?limit=20")["decisions"]
    _say("decisions pushed to the engine (newest first):")
    for d in decisions[:8]:
        gap = d["expected_gap_s"]
        extra = f" gap {gap:.1f}s" if gap is not None else ""
        extra += f" host_ttl {d['host_ttl_s']:.0f}s" if d["host_ttl_s"] is not None else ""
        _say(f"  #{d['seq']:<3} {d['session_id']:<24} {d['state']:<10}{extra}  ({d['reason']})")

    sidecar = stack.sidecar_metrics()
    engine_after = stack.engine_metrics()
    figures = {
        "external_prefix_hit_tokens_turn2": _delta(
            hits_after, hits_before, "vllm:external_prefix_cache_hits_total"
        ),
        "external_prefix_hit_tokens": _delta(
            engine_after, engine_before, "vllm:external_prefix_cache_hits_total"
        ),
        "stored_blocks": sidecar.get("tenure_adapter_stored_blocks_total", 0.0),
        "host_hit_blocks": sidecar.get("tenure_adapter_host_hit_blocks_total", 0.0),
        "refusals": sidecar.get("tenure_adapter_refusals_total", 0.0),
        "reclaimed_blocks": sidecar.get(
            'tenure_adapter_evicted_blocks_total{class="reclaim"}', 0.0
        ),
        "decisions": float(len(decisions)),
    }
    _say("adapter counters (sidecar /metrics) and engine prefix hits (vLLM /metrics):")
    for key, value in sorted(sidecar.items()):
        if key.startswith("tenure_adapter_") and "_created" not in key and value:
            _say(f"  {key} = {value:g}")
    _say(
        f"  turn 2 of {session!r} loaded {figures['external_prefix_hit_tokens_turn2']:g} prompt "
        "tokens from the host tier instead of recomputing them"
    )
    return figures


def _run(args: argparse.Namespace) -> int:
    from tenure.service.errors import UsageError
    from tenure.service.policy import UnknownPolicyError, policy_class
    from tenure.service.processes import StackError
    from tenure.service.stack import LocalStack, StackConfig

    try:
        policy_class(args.policy)
    except UnknownPolicyError as exc:
        raise UsageError(str(exc)) from None
    for flag, port in (("--port", args.port), ("--engine-port", args.engine_port)):
        if not 0 <= port <= 65535:
            raise UsageError(f"{flag} must be a port number (0-65535), got {port}")
    cache = Path(
        args.cache_dir or os.environ.get("TENURE_CACHE_DIR") or Path.home() / ".cache" / "tenure"
    )
    if args.approvals:
        from tenure.service.live.approvals import run_approvals

        with _StopSignals() as signals:
            try:
                return run_approvals(
                    args, cache, Path(args.workdir) if args.workdir else None, _say
                )
            except StackError as exc:
                print(f"tenure up: error: {exc}", file=sys.stderr)
                return 1
            except _Stopped as stop:
                _say(f"{signal.Signals(stop.signum).name}: stopped the stack")
                return 128 + stop.signum
            finally:
                signals.stopping()
    if not (args.scripted or args.no_demo):
        from tenure.service.live.cli import run_ab

        with _StopSignals() as signals:
            try:
                return run_ab(args, cache, Path(args.workdir) if args.workdir else None)
            except StackError as exc:
                print(f"tenure up: error: {exc}", file=sys.stderr)
                return 1
            except _Stopped as stop:
                # run_ab's own clean-up has stopped every stack by now (it runs on the way
                # out); later signals were ignored from the first one on.
                _say(f"{signal.Signals(stop.signum).name}: stopped the stack")
                return 128 + stop.signum
            finally:
                signals.stopping()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tenure-up-"))
    config = StackConfig(
        workdir=workdir,
        model_cache=cache / "models",
        policy=args.policy,
        proxy_port=args.port,
        engine_port=args.engine_port,
    )
    with _StopSignals() as signals:
        stack = LocalStack(config, progress=_say)
        try:
            stack.start()
            _say(f"logs in {stack.logs}")
            if not args.no_demo:
                run_demo(stack)
            if args.keep_running:
                _say(f"serving: proxy {stack.proxy_url}/v1, metrics {stack.proxy_url}/metrics, ")
                _say(f"engine {stack.engine_url}; Ctrl-C (or SIGTERM) stops everything")
                components = (stack.redis, stack.sidecar, stack.engine)
                while all(p is None or p.running for p in components):
                    time.sleep(1.0)
                _say("a component exited; stopping")
                return 1
            return 0
        except StackError as exc:
            print(f"tenure up: error: {exc}", file=sys.stderr)
            return 1
        except _Stopped as stop:
            _say(f"{signal.Signals(stop.signum).name}: stopping the stack")
            return 128 + stop.signum
        finally:
            signals.stopping()
            stack.stop()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep-running", action="store_true", help="keep the stack serving after the demo"
    )
    parser.add_argument("--no-demo", action="store_true", help="start the stack, skip the demo")
    parser.add_argument(
        "--scripted", action="store_true", help="the short scripted session instead of the A/B"
    )
    parser.add_argument(
        "--policy", default="tenure", help="host-tier policy (the A/B's treatment arm; tenure)"
    )
    parser.add_argument("--port", type=int, default=8000, help="sidecar/proxy port (0 = free)")
    parser.add_argument("--engine-port", type=int, default=0, help="vLLM port (0 = free)")
    parser.add_argument("--workdir", help="logs and Redis data (default: a new temp dir)")
    parser.add_argument(
        "--cache-dir", help="where the tiny model is cached (default TENURE_CACHE_DIR or ~/.cache)"
    )
    from tenure.service.live.approvals import configure_approvals
    from tenure.service.live.cli import configure_ab

    configure_ab(parser)
    configure_approvals(parser)
    parser.set_defaults(func=_run)
