"""``tenure up`` and ``tenure bench policy``: bad input is one line, exit 2, nothing started."""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from tenure.service.stack import TENURE_ARGV


def tenure(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TENURE_ARGV, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--policy", "nope"], "unknown policy 'nope'"),
        (["up", "--port", "70000"], "--port must be a port number"),
        (["bench", "policy", "--policy", "nope"], "unknown policy 'nope'"),
        (["bench", "policy", "--requests", "0"], "must be positive"),
    ],
)
def test_bad_input_is_one_line_exit_2(args: list[str], needle: str) -> None:
    result = tenure(*args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("tenure")]
    assert len(lines) == 1 and needle in lines[0]
    assert "Traceback" not in result.stderr


def test_bench_policy_json_has_the_issue_keys(tmp_path) -> None:
    out = tmp_path / "bench.json"
    result = tenure(
        "bench", "policy", "--requests", "200", "--sessions", "20", "--scaling", "10", "50",
        "--repeats", "1", "--json", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    import json

    data = json.loads(out.read_text())
    assert {"vllm_lru_ns_per_op", "tenure_ns_per_op", "ratio", "scaling"} <= set(data)
    assert data["vllm_lru_ns_per_op"] > 0 and data["tenure_ns_per_op"] > 0
    assert data["ratio"] == pytest.approx(
        data["tenure_ns_per_op"] / data["vllm_lru_ns_per_op"], 0.01
    )
    assert [row["sessions"] for row in data["scaling"]] == [10, 50]
    assert "per call:" in result.stdout and "wrote" in result.stdout


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["up", "--baseline", "nope"], "unknown policy 'nope'"),
        (["up", "--policy", "lru"], "--policy and --baseline are both 'lru'"),
        (["up", "--sessions", "100000"], "fit the model"),
        (["up", "--trace", "pyproject.toml"], "pyproject.toml"),
        (["up", "--budget-s", "5"], "larger than the time budget"),
        (["up", "--time-scale", "0"], "--time-scale must be a positive number"),
    ],
)
def test_ab_bad_input_is_one_line_exit_2_before_anything_starts(
    args: list[str], needle: str
) -> None:
    result = tenure(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("tenure")]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "starting" not in result.stdout  # no Redis, sidecar or engine was started


def _stat(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` fields after the command name (state, ppid, pgrp, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _children(pid: int) -> list[int]:
    import os

    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry))
    return out


def _live_in_groups(groups: set[int]) -> list[int]:
    """Processes (not zombies) in any of the process groups ``groups``."""
    import os

    live = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and fields[0] != "Z" and int(fields[2]) in groups:
                live.append(int(entry))
    return live


@pytest.mark.engine
@pytest.mark.parametrize(
    ("signame", "when"),
    [
        # Started in the background by a shell (SIGINT ignored), stopped while serving
        # (~40 s here: a whole stack starts).
        pytest.param("SIGINT", "serving:", marks=pytest.mark.slow),
        # A service manager stopping it while vLLM is still starting.
        ("SIGTERM", "starting vLLM"),
    ],
)
def test_keep_running_stops_the_whole_stack_on_a_signal(signame: str, when: str, tmp_path) -> None:
    import signal
    import time

    signum = getattr(signal, signame)
    argv = [*TENURE_ARGV, "up", "--keep-running", "--no-demo", "--port", "0"]
    process = subprocess.Popen(
        [*argv, "--workdir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # What `tenure up --keep-running &` gets from a non-interactive shell.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    groups: set[int] = set()
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            if when in line:
                break
        else:
            pytest.fail("tenure up exited early:\n" + "".join(seen))
        if signame == "SIGTERM":
            time.sleep(2.0)  # vLLM's server process is up and importing
        # Redis, the sidecar and vLLM, each in its own process group (vLLM's EngineCore in
        # vLLM's group).
        groups = set(_children(process.pid))
        assert len(groups) == 3, groups
        process.send_signal(signum)
        rest = process.communicate(timeout=90)[0]
        assert process.returncode == 128 + signum
        assert f"{signame}: stopping the stack" in rest and "stack stopped" in rest
        assert _live_in_groups(groups) == [], "a component outlived tenure up"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        import os

        for group in groups:  # never leave a stray stack behind, even when the test fails
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, 9)
