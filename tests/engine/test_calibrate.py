"""``tenure calibrate`` against a real CPU vLLM server (tiny model, Tenure's offloading spec).

The measured numbers are CPU numbers on a shared machine (noise, not hardware facts); what is
checked is the procedure: the vector is positive with ``beta3 >= beta2``, the host-tier resume
really came from the host tier, the vector lands in a real sidecar's ``/admin/config``, and bad
input fails with one line and exit code 2 without changing the sidecar's configuration.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tenure.engine_adapter.cpu_engine import CPU_ENGINE_ENV, kv_transfer_config, server_args
from tenure.service.app import create_app
from tenure.service.calibrate.cli import write_sidecar
from tenure.service.cli import UsageError, main
from tenure.service.policy.retention import PriceVector
from tenure.service.processes import ManagedProcess, free_port, http_ok
from tenure.service.settings import Settings
from tests.engine.conftest import model_cache_dir
from tests.sidecar.fake_upstream import ServerThread

pytestmark = [pytest.mark.engine, pytest.mark.filterwarnings("ignore::FutureWarning")]

TOKEN = "calibrate-test-token"


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import sys

    from tenure.service.tools.tiny_model import ensure_tiny_model

    model = ensure_tiny_model(model_cache_dir())
    port = free_port()
    # A host tier several pools large: the flood that pushes the probe out of HBM must not
    # push it out of the host tier too.
    transfer = kv_transfer_config(policy="tenure", host_blocks=40)
    args = server_args(str(model), port, gpu_blocks=6, transfer=transfer, max_model_len=640)
    log = tmp_path_factory.mktemp("calibrate") / "vllm.log"
    env = {**CPU_ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args]
    process = ManagedProcess("vllm", argv, log, env=env).start()
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_until(lambda: http_ok(f"{url}/health"), 240)
        yield url
    finally:
        process.stop()


@pytest.fixture
def sidecar(redis_url: str, engine_url: str) -> Iterator[ServerThread]:
    values: dict[str, Any] = {
        "redis_url": redis_url, "upstream_url": engine_url, "admin_token": TOKEN, "push_addr": ""
    }  # fmt: skip
    settings = Settings(**values)
    server = ServerThread(create_app(settings)).start()
    try:
        yield server
    finally:
        server.stop()


def _config(sidecar: ServerThread) -> dict[str, Any]:
    response = httpx.get(
        f"{sidecar.url}/admin/config", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    response.raise_for_status()
    doc: dict[str, Any] = response.json()
    return doc


def test_calibrate_measures_a_sane_vector_and_writes_it_to_the_sidecar(
    engine_url: str, sidecar: ServerThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cal.json"
    before = _config(sidecar)
    rc = main([
        "calibrate", "--engine", engine_url, "--repeats", "5", "--json", str(out),
        "--write-sidecar", sidecar.url, "--admin-token", TOKEN,
    ])  # fmt: skip
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert TOKEN not in printed.out + printed.err  # the secret is never echoed
    doc = json.loads(out.read_text())
    price = doc["price"]
    assert price["alpha1_gpu_s_per_s"] > 0 and price["beta3_gpu_s"] > 0
    assert price["beta3_gpu_s"] >= price["beta2_gpu_s"] >= 0
    # alpha1 is the measured footprint's share of the engine's pool (6 blocks of 128 tokens).
    assert doc["pool_tokens"] == 6 * 128
    assert price["alpha1_gpu_s_per_s"] == pytest.approx(doc["footprint_tokens"] / 768)
    # The host resume was a host resume: vLLM counted the restored prompt tokens as external.
    assert doc["host_restored_tokens"] >= 256
    assert len(doc["recompute_s"]["values"]) == 5
    assert doc["t_star_s"] == pytest.approx(price["beta3_gpu_s"] / price["alpha1_gpu_s_per_s"])
    assert "t1 = beta2/alpha1" in printed.out and "t* = beta3/alpha1" in printed.out
    after = _config(sidecar)
    assert after["version"] == before["version"] + 1
    assert after["price"] == pytest.approx(price)


def test_a_vector_the_sidecar_refuses_changes_nothing(sidecar: ServerThread) -> None:
    before = _config(sidecar)

    class Measured:
        price = PriceVector(alpha1=2e6, beta2=0.01, beta3=1.0)  # alpha1 above the 1e6 limit

    with pytest.raises(UsageError, match=r"HTTP 422.*alpha1_gpu_s_per_s"):
        write_sidecar(sidecar.url, TOKEN, Measured(), 10.0)
    with pytest.raises(UsageError, match="refused the admin token"):
        write_sidecar(sidecar.url, "wrong", Measured(), 10.0)
    assert _config(sidecar) == before


def test_calibrate_bad_input_is_one_line_exit_2(
    engine_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    free = f"http://127.0.0.1:{free_port()}"
    cases = [
        (["--engine", free], "not reachable"),
        (["--engine", engine_url, "--repeats", "0"], "--repeats"),
        (["--engine", engine_url, "--beta2", "-1"], "--beta2"),
        (["--engine", engine_url, "--ranks", "x"], "--ranks"),
        (["--engine", engine_url, "--prefix-tokens", "600", "--suffix-tokens", "200"], "exceeds"),
    ]
    for argv, needle in cases:
        assert main(["calibrate", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert needle in err and len(err.splitlines()) == 1, err
    # An allowance above any recompute this engine measures: after the repeats' progress, one
    # line names it and what to do.
    assert main(["calibrate", "--engine", engine_url, "--repeats", "1", "--beta2", "100"]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "below the --beta2 allowance 100 GPU-s" in last, last
