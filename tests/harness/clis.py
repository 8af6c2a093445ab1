"""The real Claude Code and Codex CLIs: installed from the npm registry, pinned, and run.

:func:`install` puts both packages into ``.harness-clis/`` at the repository root (gitignored)
with ``npm install --prefix``, once: a second call finds the pinned versions there and does
nothing. It returns why not instead of raising when npm or the registry cannot be reached, so
the tests skip with that reason. The Codex package carries its native binary in a platform
dependency (``@openai/codex-linux-x64``); :func:`install` checks that both CLIs run.

:func:`claude_env` and :func:`codex_home` are the exact settings the docs give a user: Claude
Code reads ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``; Codex reads a model provider from
``$CODEX_HOME/config.toml`` whose ``base_url`` is the sidecar's ``/v1`` with ``wire_api =
"responses"`` and whose key comes from the variable ``env_key`` names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CLAUDE_CODE_VERSION",
    "CODEX_VERSION",
    "CliRun",
    "Clis",
    "claude_env",
    "codex_env",
    "codex_home",
    "install",
]

#: The versions the harness profiles were checked on (tenure.service.harness.profiles).
CLAUDE_CODE_VERSION = "2.1.332"
CODEX_VERSION = "0.171.0"
ROOT = Path(__file__).resolve().parents[2]
PREFIX = ROOT / ".harness-clis"


@dataclass(frozen=True, slots=True)
class Clis:
    claude: Path
    codex: Path


@dataclass(frozen=True, slots=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def _installed_version(package: str) -> str | None:
    manifest = PREFIX / "node_modules" / package / "package.json"
    try:
        return str(json.loads(manifest.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


def _runs(binary: Path) -> bool:
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "DISABLE_AUTOUPDATER": "1"},
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def install() -> Clis | str:
    """Both CLIs at their pinned versions, or the reason they cannot be had here."""
    wanted = {"@anthropic-ai/claude-code": CLAUDE_CODE_VERSION, "@openai/codex": CODEX_VERSION}
    bin_dir = PREFIX / "node_modules" / ".bin"
    clis = Clis(claude=bin_dir / "claude", codex=bin_dir / "codex")
    if any(_installed_version(p) != v for p, v in wanted.items()):
        npm = shutil.which("npm")
        if npm is None:
            return "npm is not installed (node and npm are needed for the real CLIs)"
        specs = [f"{p}@{v}" for p, v in wanted.items()]
        try:
            done = subprocess.run(
                [npm, "install", "--no-audit", "--no-fund", "--prefix", str(PREFIX), *specs],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return "npm install of the CLIs timed out (is the npm registry reachable?)"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            return "npm install of the CLIs failed (registry unreachable?): " + " | ".join(tail)
    for path in (clis.claude, clis.codex):
        if not _runs(path):
            return f"{path.name} --version does not run here (native binary missing?)"
    return clis


def claude_env(base_url: str, api_key: str, home: Path, model: str = "scripted") -> dict[str, str]:
    """Claude Code pointed at the sidecar, with its background traffic off; ``model`` is the
    name the engine serves (the scripted engine answers to any)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_SUBAGENT_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_MAX_RETRIES": "2",
        "IS_SANDBOX": "1",
    }


def codex_home(home: Path, base_url: str, model: str = "scripted") -> Path:
    """A ``CODEX_HOME`` whose config points Codex at the sidecar (``base_url`` ends in /v1)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\n'
        'model_provider = "tenure"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "\n"
        "[model_providers.tenure]\n"
        'name = "Tenure"\n'
        f'base_url = "{base_url}"\n'
        'wire_api = "responses"\n'
        'env_key = "TENURE_API_KEY"\n'
        "request_max_retries = 2\n"
        "stream_max_retries = 2\n"
    )
    return home


def codex_env(home: Path, api_key: str, user_home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(user_home),
        "CODEX_HOME": str(home),
        "TENURE_API_KEY": api_key,
        "RUST_LOG": "error",
    }


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float = 120.0) -> CliRun:
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return CliRun(done.returncode, done.stdout, done.stderr)
