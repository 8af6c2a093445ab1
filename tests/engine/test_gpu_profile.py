"""The GPU profile command end to end, on the CPU: ``scripts/gpu_profile.sh --cpu-dry-run``.

Every step of the GPU run (the Llama model built from a config with random bf16 weights,
prefill over a cached context, decode over a random KV cache, block copies in vLLM's layout,
the fits) runs on a tiny shape; the profile file it writes is then loaded by name, as the
replay's ``--hardware`` does, and replayed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tenure.service.calibrate.gpu_profile import fit_line
from tenure.service.cli import main
from tenure.service.errors import UsageError
from tenure.service.replay.hardware import PROFILES, get_profile

REPO = Path(__file__).resolve().parents[2]
NAME = "h200-llama3-8b-measured-cpu-dry-run"


def test_fit_line_recovers_a_line() -> None:
    """The fits are plain least squares: an exact line comes back exactly."""
    a, b = fit_line([1, 2, 4, 8], [3 + 0.5 * x for x in (1, 2, 4, 8)])
    assert a == pytest.approx(3.0) and b == pytest.approx(0.5)
    assert fit_line([2, 2], [1.0, 3.0]) == (2.0, 0.0)


def test_h200_spec_profile_sits_beside_the_measured_one() -> None:
    h200, h100 = PROFILES["h200-llama3-8b"], PROFILES["h100-llama3-8b"]
    assert h200.hbm_bandwidth_per_gpu > h100.hbm_bandwidth_per_gpu
    assert h200.kv_pool_blocks(16) > h100.kv_pool_blocks(16)


@pytest.mark.slow
def test_cpu_dry_run_writes_a_profile_the_replay_loads_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [str(REPO / "scripts" / "gpu_profile.sh"), "--cpu-dry-run", "--out", str(tmp_path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"--hardware {NAME}" in run.stdout
    doc = json.loads((tmp_path / f"{NAME}.json").read_text())
    m = doc["measurements"]
    # Every step ran, on every point of the dry plan.
    assert {(p["tokens"], p["context"]) for p in m["prefill"]} == {
        (8, 0), (32, 0), (8, 32), (32, 32)
    }  # fmt: skip
    assert len(m["decode"]) == 4
    assert {t["direction"] for t in m["transfers"]} == {"store", "load"}
    assert all(p["seconds"] > 0 for part in m.values() for p in part)
    assert doc["environment"]["dry_run"] is True
    assert doc["model"]["config"]["hidden_size"] == 64  # the tiny shape, not the 8B
    # Loaded by name, as --hardware does.
    monkeypatch.setenv("TENURE_HARDWARE_PATH", str(tmp_path))
    profile = get_profile(NAME)
    assert profile.name == NAME
    assert 0 < profile.pcie_efficiency <= 1 and profile.transfer_latency_s >= 0
    assert profile.hbm_bytes_per_gpu == PROFILES["h200-llama3-8b"].hbm_bytes_per_gpu
    with pytest.raises(UsageError, match=NAME):
        get_profile("no-such-profile")
    # The replay runs on it.
    from tenure.service.replay.paths import claude_code_trace

    argv = ["replay", "ladder", "--trace", str(claude_code_trace()), "--max-sessions", "2",
            "--policies", "lru", "--hardware", NAME, "--seeds", "0"]  # fmt: skip
    assert main(argv) == 0
    assert "lru" in capsys.readouterr().out


def test_a_broken_profile_file_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken.json").write_text("{}")
    monkeypatch.setenv("TENURE_HARDWARE_PATH", str(tmp_path))
    with pytest.raises(UsageError, match="not a hardware profile file"):
        get_profile("broken")
