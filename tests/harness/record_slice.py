"""Record a slice of real Claude Code and Codex traffic through ``tenure serve`` (issue 24).

``python -m tests.harness.record_slice --out results/harness/slice.jsonl`` starts a Redis, the
scripted engine and ``tenure serve`` with recording on, runs the real CLIs (one-shot runs,
runs resumed with ``--continue`` / ``resume --last``, Claude Code runs with a sub-agent) and
writes the recording as a canonical trace (``tenure record export``), whose turns carry the
sidecar's inferred ends (``hints.likely_end``). ``tenure replay ladder --ends ...`` on it shows
what the end inference changes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.conftest import RedisProcess, wait_for
from tests.harness import clis
from tests.harness.scripted_engine import ScriptedEngine
from tests.sidecar.fake_upstream import ServerThread, free_port

ADMIN = "slice-admin-token"
KEYS = {"claude": "sk-slice-claude", "codex": "sk-slice-codex"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=4, help="runs of each kind (default 4)")
    args = parser.parse_args()
    found = clis.install()
    if isinstance(found, str):
        print(f"record_slice: {found}", file=sys.stderr)
        return 2
    root = Path(__file__).resolve().parents[2]
    redis_server = RedisProcess().start()
    engine = ScriptedEngine()
    upstream = ServerThread(engine).start()
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(root),
        "TENURE_PORT": str(port), "TENURE_UPSTREAM_URL": upstream.url,
        "TENURE_REDIS_URL": redis_server.url, "TENURE_ADMIN_TOKEN": ADMIN,
        "TENURE_PUSH_ADDR": "", "TENURE_SEGMENTS": "1", "TENURE_RECORD_ENABLED": "1",
        "TENURE_TENANTS": json.dumps({KEYS["claude"]: {"name": "claude"},
                                      KEYS["codex"]: {"name": "codex"}}),
    }  # fmt: skip
    serve = subprocess.Popen(
        [sys.executable, "-m", "tenure.service.cli", "serve"], env=env, cwd=root
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout_s=240, interval_s=0.5)
        with tempfile.TemporaryDirectory() as tmp:
            _runs(found, url, Path(tmp), args.runs)
        reply = httpx.get(
            f"{url}/admin/record/export?block_tokens=16",
            headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60,
        )  # fmt: skip
        reply.raise_for_status()
        args.out.write_text(reply.text)
        print(f"record_slice: wrote {args.out} ({reply.text.count(chr(10)) - 1} sessions)")
        return 0
    finally:
        serve.terminate()
        serve.wait(timeout=20)
        upstream.stop()
        redis_server.close()


def _runs(found: clis.Clis, url: str, tmp: Path, n: int) -> None:
    def claude(work: Path, *argv: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        env = clis.claude_env(url, KEYS["claude"], work / "home")
        done = clis.run([str(found.claude), "-p", *argv, "--allowedTools", "Bash Agent"], env, work)
        print(f"claude {' '.join(argv)[:40]!r}: rc={done.returncode}", flush=True)

    def codex(work: Path, *argv: str) -> None:
        work.mkdir(parents=True, exist_ok=True)
        home = clis.codex_home(work / "codex-home", f"{url}/v1")
        env = clis.codex_env(home, KEYS["codex"], work / "home")
        flags = ["--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"]
        done = clis.run([str(found.codex), "exec", *flags, *argv], env, work)
        print(f"codex {' '.join(argv)[:40]!r}: rc={done.returncode}", flush=True)

    for i in range(n):
        claude(tmp / f"c{i}", "Use the shell")
        claude(tmp / f"s{i}", "Please [spawn] a sub-agent to check the shell")
        codex(tmp / f"x{i}", "Use the shell")
    time.sleep(2.0)  # a pause before the resumed runs: they come back later
    for i in range(0, n, 2):
        claude(tmp / f"c{i}", "--continue", "Use the shell again")
        codex(tmp / f"x{i}", "resume", "--last", "Use the shell again")


if __name__ == "__main__":
    raise SystemExit(main())
