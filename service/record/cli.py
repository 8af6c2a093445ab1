"""``tenure record``: switch the sidecar's traffic recording and export it as a trace.

``tenure record export --out PATH`` writes the recording in the canonical format, ready for
``tenure replay ladder --format canonical --trace PATH``; ``on`` / ``off`` / ``status`` /
``clear`` drive ``/admin/record``. The sidecar is ``--url`` (default ``TENURE_URL`` or
``http://127.0.0.1:8000``); the admin token is ``TENURE_ADMIN_TOKEN`` (not needed by a
``--dev`` sidecar without one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from tenure.service.errors import UsageError
from tenure.service.processes import retry_after_s

__all__ = ["configure"]

_TIMEOUT_S = 60.0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=os.environ.get("TENURE_URL", "http://127.0.0.1:8000"),
        help="the sidecar (default TENURE_URL or http://127.0.0.1:8000)",
    )  # fmt: skip
    sub = parser.add_subparsers(dest="action", required=True)
    export = sub.add_parser("export", help="write the recording as a canonical-format trace")
    export.add_argument("--out", type=Path, required=True, help="the trace file to write")
    export.add_argument(
        "--block-tokens", type=int, default=16, help="tokens per KV block of the trace (16)"
    )
    for name, text in (
        ("on", "start recording (this replica)"),
        ("off", "stop recording (this replica)"),
        ("status", "what the recording holds"),
        ("clear", "forget the recording"),
    ):
        sub.add_parser(name, help=text)
    parser.set_defaults(func=run)


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """One admin call. A 503 with ``Retry-After`` (the sidecar's Redis away for a moment) is
    retried after the delay it names, for up to the call's 60 s in all: the API's contract."""
    import httpx

    headers = {}
    token = os.environ.get("TENURE_ADMIN_TOKEN")
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = args.url.rstrip("/") + path
    deadline = time.monotonic() + _TIMEOUT_S
    while True:
        try:
            response = httpx.request(method, url, json=body, headers=headers, timeout=_TIMEOUT_S)
        except httpx.HTTPError as exc:
            raise UsageError(f"{url}: {exc}") from None
        delay = retry_after_s(response.status_code, response.headers.get("Retry-After"))
        if delay is None or time.monotonic() + delay > deadline:
            break
        time.sleep(delay)
    if response.status_code != 200:
        try:
            detail = response.json().get("error", {}).get("message") or response.text
        except ValueError:
            detail = response.text
        raise UsageError(f"{url}: HTTP {response.status_code}: {str(detail)[:200]}")
    return response


def run(args: argparse.Namespace) -> int:
    if args.action == "export":
        if args.block_tokens < 1:
            raise UsageError("--block-tokens must be >= 1")
        if not args.out.parent.is_dir():
            raise UsageError(f"{args.out}: the directory {args.out.parent} does not exist")
        response = _call(args, "GET", f"/admin/record/export?block_tokens={args.block_tokens}")
        text = response.text
        args.out.write_text(text, encoding="utf-8")
        lines = text.count("\n")
        print(f"tenure record: wrote {args.out} ({max(0, lines - 1)} sessions)")
        return 0
    method, body = {
        "on": ("PUT", {"enabled": True}),
        "off": ("PUT", {"enabled": False}),
        "status": ("GET", None),
        "clear": ("DELETE", None),
    }[args.action]
    status = _call(args, method, "/admin/record", body).json()
    json.dump(status, sys.stdout)
    print()
    return 0
