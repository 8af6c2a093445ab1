"""The adapter's policy tests on another vLLM release's pure-Python offloading modules.

``scripts/vllm_policy_tests_newest.sh`` unpacks the ``.py`` files of a vLLM wheel (default:
the newest release on the package index) into an overlay directory; this test re-runs the
engine-free adapter tests (policy mapping, manager contract, contract fuzz, LRU/ARC exactness,
segment book, the compat names) with that overlay first on the path, so the release's own
``CachePolicy`` and ``CPUOffloadingManager`` code calls ours (0.33 calls
``insert(key, chunk, req_context)``). Without an overlay it skips and says how to make one.
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
]

#: Tests whose expectation is a property of one vLLM release, not of the adapter, per release
#: (``-k`` expression to leave out, and why). vLLM 0.33's ``LRUCachePolicy`` ranks a request's
#: keys provisionally by token position (tails before heads) and commits recency when the
#: request finishes; Tenure's core ``lru`` replicates 0.32's per-insert recency, so the
#: "same victims as vLLM's LRU" replica test diverges by design on 0.33 (ARC still matches).
KNOWN_DIFFERENCES: dict[tuple[int, int], tuple[str, str]] = {
    (0, 33): (
        "not (test_same_decisions_as_vllm and lru-)",
        "0.33 LRU ranks a request's keys by position, 0.32 by insert",
    ),
}


def _overlay() -> Path | None:
    named = os.environ.get(_ENV)
    if named:
        return Path(named)
    root = Path.home() / ".cache" / "tenure" / "vllm-overlay"
    found = sorted(p for p in root.glob("*") if (p / "vllm" / "__init__.py").is_file())
    return found[-1] if found else None


@pytest.mark.skipif(os.environ.get(_CHILD) == "1", reason="runs in the parent only")
def test_adapter_policy_tests_pass_on_the_overlay_release() -> None:
    overlay = _overlay()
    if overlay is None or not (overlay / "vllm" / "__init__.py").is_file():
        pytest.skip(
            "no vLLM overlay (pure-Python modules of another release): make one with "
            "scripts/vllm_policy_tests_newest.sh [VERSION]"
        )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(overlay), str(REPO)]),
        _CHILD: "1",
        _ENV: str(overlay),
    }
    version = tuple(int(x) for x in overlay.name.split(".")[:2])
    known = KNOWN_DIFFERENCES.get((version[0], version[1]) if len(version) == 2 else (0, 0))
    select = ["-k", known[0]] if known else []
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select,
         __file__, *POLICY_TESTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500,
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
