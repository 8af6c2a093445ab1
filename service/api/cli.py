"""``tenure serve``: run the sidecar from ``TENURE_*`` environment settings."""

from __future__ import annotations

import argparse

__all__ = ["configure"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (default: TENURE_HOST or 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: TENURE_PORT or 8000)")
    parser.add_argument(
        "--dev", action="store_true", help="local development mode: admin routes without a token"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    parser.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    import sys

    import uvicorn

    from tenure.service.api.routes.server import uvicorn_config
    from tenure.service.app import create_app
    from tenure.service.errors import UsageError
    from tenure.service.settings import SettingsError, load_settings

    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.dev:
        overrides["dev_mode"] = True
    try:
        settings = load_settings(**overrides)
    except SettingsError as exc:
        raise UsageError(str(exc)) from None
    for warning in settings.startup_warnings():
        print(f"tenure serve: warning: {warning}", file=sys.stderr)
    loop = "uvloop" if _has("uvloop") else "asyncio"
    try:
        app = create_app(settings, freeze_gc=True)
    except SettingsError as exc:  # e.g. a worker-ranker artefact that does not load
        raise UsageError(str(exc)) from None
    config = uvicorn_config(app, settings, log_level=args.log_level, loop=loop)
    uvicorn.Server(config).run()
    return 0


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
