"""The adapter's policy tests on another vLLM release's pure-Python offloading modules.

``scripts/vllm_policy_tests_newest.sh`` unpacks the ``.py`` files of a vLLM wheel (default:
the newest release on the package index) into an overlay directory; this test re-runs the
engine-free adapter tests (policy mapping, manager contract, contract fuzz, LRU/ARC exactness,
segment book, the compat names) with that overlay first on the path, so the release's own
``CachePolicy`` and ``CPUOffloadingManager`` code calls ours (0.33 calls
``insert(key, chunk, req_context)``, ``on_request_access``, request-ranked LRU). The bootstrap
builds the 0.33.0 overlay, so CI runs every test on both releases; without an overlay this test
fails and says how to make one. No test is left out on any release.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_ENV = "TENURE_VLLM_OVERLAY"
_CHILD = "TENURE_VLLM_OVERLAY_CHILD"
#: The adapter tests that need vLLM's offloading modules but no engine.
POLICY_TESTS = [
    "tests/engine/test_policy_mapping.py",
    "tests/engine/test_adapter_contract.py",
    "tests/engine/test_contract_fuzz.py",
    "tests/engine/test_lru_arc_through_adapter.py",
    "tests/engine/test_segment_book.py",
    "tests/engine/test_vllm_compat.py",
    "tests/engine/test_adapter_threads.py",
]


def _overlay() -> Path | None:
    named = os.environ.get(_ENV)
    if named:
        return Path(named)
    root = Path.home() / ".cache" / "tenure" / "vllm-overlay"
    found = sorted(p for p in root.glob("*") if (p / "vllm" / "__init__.py").is_file())
    return found[-1] if found else None


@pytest.mark.slow
@pytest.mark.timeout(2400)  # every engine-free adapter test once more, in a child pytest
@pytest.mark.skipif(os.environ.get(_CHILD) == "1", reason="runs in the parent only")
def test_adapter_policy_tests_pass_on_the_overlay_release() -> None:
    overlay = _overlay()
    if overlay is None or not (overlay / "vllm" / "__init__.py").is_file():
        pytest.fail(
            "no vLLM overlay (pure-Python modules of vLLM 0.33): make one with "
            "scripts/vllm_overlay.sh 0.33.0 (scripts/bootstrap.sh does)"
        )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(overlay), str(REPO)]),
        _CHILD: "1",
        _ENV: str(overlay),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         __file__, *POLICY_TESTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=2300,
    )  # fmt: skip
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, f"adapter tests on {overlay.name}:\n{tail}"
    summary = run.stdout.strip().splitlines()[-1]
    # Every selected test ran: the only skip is this test itself, in the child.
    assert " passed" in summary and " failed" not in summary, tail
    assert "1 skipped" in summary or "skipped" not in summary, tail


@pytest.mark.skipif(os.environ.get(_CHILD) != "1", reason="runs under an overlay only")
def test_the_overlay_release_is_the_one_imported() -> None:
    import vllm
    from vllm.v1.kv_offload.cpu.policies.base import CachePolicy

    overlay = Path(os.environ[_ENV])
    assert Path(vllm.__file__).is_relative_to(overlay), vllm.__file__
    assert vllm.__version__ == overlay.name, (vllm.__version__, overlay.name)
    params = inspect.signature(CachePolicy.insert).parameters
    major_minor = tuple(int(x) for x in vllm.__version__.split(".")[:2])
    if major_minor >= (0, 33):
        assert "req_context" in params  # the path this run exists for
