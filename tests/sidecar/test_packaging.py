"""``pip install .`` with no extras gives a sidecar that starts (issue 10, packaging).

A fresh virtualenv (pip's ordinary install from the package index, with build isolation, so a
missing runtime dependency cannot hide behind this checkout's ``.venv``) gets the project as the
sidecar image gets it: the files ``deploy/docker/Dockerfile`` copies, installed without extras.
Then ``tenure serve`` must start and proxy a request, and neither the simulator's stack
(numpy, matplotlib) nor the engine (torch, vLLM) nor the SDK's openai client may be installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import httpx
import pytest

from tests.conftest import RedisProcess
from tests.sidecar.fake_upstream import FakeUpstream, ServerThread, free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
#: What a no-extras install must not pull: the simulator's, the engine's and the SDK's stacks.
NOT_IN_THE_SIDECAR = ("numpy", "matplotlib", "torch", "vllm", "openai", "transformers")


def _copied_by_the_dockerfile() -> list[str]:
    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    names: list[str] = []
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            names += line.split()[1:-1]
    return names


def test_the_image_installs_the_base_requirements_only() -> None:
    text = (REPO / "deploy" / "docker" / "Dockerfile").read_text()
    # `pip wheel .` / the wheels installed as they are: the base requirements, no extras.
    assert re.search(r"pip wheel [^\n]*\s\.\s*$", text, re.M)
    assert "[" not in re.search(r"pip wheel ([^\n]*)", text).group(1)  # type: ignore[union-attr]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=;\[ ]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert {"httptools", "uvicorn", "fastapi", "redis", "hiredis", "pyzmq", "msgspec"} <= base
    assert not base & set(NOT_IN_THE_SIDECAR)
    assert set(project["optional-dependencies"]) >= {"replay", "clients", "engine", "dev"}


def test_a_fresh_no_extras_install_serves(tmp_path: Path, redis_server: RedisProcess) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in _copied_by_the_dockerfile():
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, source / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
        timeout=120, env=env, check=True,
    ).stdout.lower()  # fmt: skip
    names = {line.split("==")[0].replace("_", "-") for line in listed.splitlines()}
    assert not names & set(NOT_IN_THE_SIDECAR), names & set(NOT_IN_THE_SIDECAR)
    assert "httptools" in names
    # A command of another part says which extra it needs, in one line.
    sdk = subprocess.run(
        [str(venv / "bin" / "tenure"), "bench", "sdk", "--help"], capture_output=True,
        text=True, timeout=120, env=env,
    )  # fmt: skip
    assert sdk.returncode == 2 and "pip install 'tenure[clients]'" in sdk.stderr, sdk.stderr
    assert "Traceback" not in sdk.stderr

    fake = FakeUpstream()
    engine = ServerThread(fake).start()
    port = free_port()
    serve_env = {
        **env,
        "TENURE_PORT": str(port),
        "TENURE_UPSTREAM_URL": engine.url,
        "TENURE_REDIS_URL": redis_server.url,
        "TENURE_REDIS_PREFIX": "packaging-test",
        "TENURE_ADMIN_TOKEN": "packaging-test-token",
        "TENURE_PUSH_ADDR": f"tcp://127.0.0.1:{free_port()}",
    }
    process = subprocess.Popen(
        [str(venv / "bin" / "tenure"), "serve", "--log-level", "warning"], env=serve_env,
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).json()["redis"] is True:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                raise AssertionError(process.stderr.read().decode() if process.stderr else "")
            assert time.monotonic() < deadline, "tenure serve did not start"
            time.sleep(0.2)
        reply = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": "echo", "messages": [{"role": "user", "content": "x"}]},
            headers={"X-Tenure-Session": "packaged"},
            timeout=10,
        )
        assert reply.status_code == 200
        tenure = fake.received[-1].body["kv_transfer_params"]["tenure"]
        assert tenure["session_id"] == "default/packaged"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        engine.stop()
