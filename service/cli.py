"""The ``tenure`` command line.

Each command lives in the package that owns it and is imported only when used, so
``tenure replay`` never imports the web stack and ``tenure serve`` never imports the simulator.
A command module exposes ``configure(parser)``, which adds its arguments (and sub-commands) and
sets ``func`` (``Callable[[argparse.Namespace], int]``) as a parser default.

Errors a user can fix (a bad flag, a missing or malformed file, an unknown policy) raise
:class:`tenure.service.errors.UsageError` and print one line, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from tenure.service.errors import UsageError

__all__ = ["UsageError", "main"]

#: command -> (module, help). ``bench`` has sub-commands of its own, listed in ``_BENCHES``.
_COMMANDS: dict[str, tuple[str, str]] = {
    "replay": ("tenure.service.replay.cli", "replay agent traces through the engine model"),
    "serve": (
        "tenure.service.api.cli",
        "run the sidecar (OpenAI-compatible proxy + lifecycle API)",
    ),
    "up": (
        "tenure.service.stack_cli",
        "start a local stack (Redis, CPU vLLM + adapter, sidecar) and demo it",
    ),
    "calibrate": (
        "tenure.service.calibrate.cli",
        "measure the retention price vector on a live vLLM engine",
    ),
    "state": ("tenure.service.state.cli", "Redis state maintenance (migrate-keys)"),
    "calibrate-profile": (
        "tenure.service.calibrate.profile_cli",
        "measure the simulator's CPU hardware profile on the live A/B's engine",
    ),
    "record": (
        "tenure.service.record.cli",
        "switch the sidecar's traffic recording; export it as a canonical trace",
    ),
    "train-ranker": (
        "tenure.service.replay.ranker_cli",
        "train the worker-lifetime ranker on a trace's sub-agent spawns",
    ),
}
_BENCHES: dict[str, tuple[str, str]] = {
    "proxy": ("tenure.benchmarks.proxy", "added latency and throughput of the proxy"),
    "policy": ("tenure.benchmarks.policy", "per-call cost of the adapter policy vs vLLM's LRU"),
    "replay": ("tenure.benchmarks.replay", "speed of one replay over a whole trace"),
    "sdk": ("tenure.benchmarks.sdk", "cost the client SDK adds per completion call"),
    "redis-wait": (
        "tenure.benchmarks.redis_wait",
        "cost of WAIT 1 (synchronous replication) per write",
    ),
    "soak": (
        "tenure.benchmarks.soak.cli",
        "chaos soak: router, 2 engines, 2 sidecars, Redis with Sentinel, faults, ledger",
    ),
}


#: Optional dependencies -> the extra that installs them (the base install is the sidecar).
_EXTRAS = {
    "numpy": "replay",
    "matplotlib": "replay",
    "openai": "clients",
    # The HTTP client the openai and anthropic SDKs are built on (``tenure bench sdk`` uses it).
    "httpx2": "clients",
    "vllm": "engine-cpu",
    "torch": "engine-cpu",
    "transformers": "dev",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the problem, as every other bad-input path prints.
        self.exit(2, f"{self.prog}: error: {message}\n")


def _configure(parser: argparse.ArgumentParser, module_name: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in _EXTRAS:
            raise
        raise UsageError(
            f"{parser.prog} needs {top}, which this install does not have: "
            f"pip install 'tenure[{_EXTRAS[top]}]'"
        ) from None
    module.configure(parser)


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="tenure", description="KV-cache lifecycle control for agent serving")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    wanted = argv[0] if argv else None
    for name, (module_name, help_text) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text)
        if name == wanted:
            _configure(sub, module_name)
    bench = commands.add_parser("bench", help="benchmarks that print figures and write JSON")
    benches = bench.add_subparsers(dest="bench", metavar="BENCH", parser_class=_Parser)
    wanted_bench = argv[1] if wanted == "bench" and len(argv) > 1 else None
    for name, (module_name, help_text) in _BENCHES.items():
        sub = benches.add_parser(name, help=help_text)
        if name == wanted_bench:
            _configure(sub, module_name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser(args_list)
    except UsageError as exc:
        print(f"tenure: error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(args_list)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return func(args)
    except UsageError as exc:
        print(f"tenure: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top not in _EXTRAS:
            raise
        print(
            f"tenure: error: this command needs {top}, which this install does not have: "
            f"pip install 'tenure[{_EXTRAS[top]}]'",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("tenure: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
