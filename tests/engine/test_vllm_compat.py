"""Each private vLLM name in ``tenure.engine_adapter.vllm_compat`` exists on the installed vLLM.

A vLLM upgrade that moves one fails here, naming it and what breaks, before an engine test
fails somewhere downstream for a reason that is hard to read.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re

import pytest
import vllm

from tenure.engine_adapter.vllm_compat import PRIVATE_NAMES, PrivateName


def _owner(entry: PrivateName) -> object:
    module_name, _, class_name = entry.owner.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name) if class_name else module


def _present(entry: PrivateName) -> bool:
    owner = _owner(entry)
    if entry.kind == "field":
        assert isinstance(owner, type) and dataclasses.is_dataclass(owner)
        return entry.name in {f.name for f in dataclasses.fields(owner)}
    if entry.kind in ("class_attr", "function"):
        return hasattr(owner, entry.name)
    if entry.kind == "method":
        return callable(getattr(owner, entry.name, None))
    # An instance attribute: some class of the owner's MRO (vLLM's own) sets it.
    assert isinstance(owner, type)
    pattern = re.compile(rf"\bself\.{re.escape(entry.name)}\s*(:[^=]*)?=")
    return any(
        pattern.search(inspect.getsource(cls))
        for cls in owner.__mro__
        if cls.__module__.startswith("vllm.")
    )


@pytest.mark.parametrize("entry", PRIVATE_NAMES, ids=lambda e: f"{e.owner}.{e.name}")
def test_private_vllm_name_is_where_the_adapter_reaches_for_it(entry: PrivateName) -> None:
    assert _present(entry), (
        f"vLLM {vllm.__version__}: {entry.owner} has no {entry.kind} {entry.name!r} "
        f"(checked on {', '.join(entry.checked_on)}); what breaks without it: {entry.breaks}. "
        "Update engine_adapter/vllm_compat.py for this release."
    )


def test_the_adapter_spells_no_private_vllm_name_outside_the_compat_module() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "engine_adapter"
    names = {entry.name for entry in PRIVATE_NAMES}
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "vllm_compat.py":
            continue
        text = path.read_text()
        offenders += [f"{path.relative_to(root)}: {n}" for n in names if f".{n}" in text]
    assert not offenders, offenders


@pytest.mark.parametrize("version", ["0.31.2", "0.34.0", "1.0.0", "0.33rc1.dev2", "dev"])
def test_another_vllm_release_gets_one_error_naming_the_supported_range(version: str) -> None:
    from tenure.engine_adapter.vllm_compat import UnsupportedVllmError, check_supported

    with pytest.raises(UnsupportedVllmError, match=r"supports vLLM 0\.32\.x to 0\.33\.x"):
        check_supported(version)


def test_the_installed_vllm_is_supported_and_tenure_lru_follows_its_lru() -> None:
    from tenure.engine_adapter.vllm_compat import check_supported, core_params

    release = check_supported()
    assert release in ((0, 32), (0, 33))
    expected = 1.0 if release >= (0, 33) else 0.0
    assert core_params("lru", None) == {"request_ranks": expected}
    assert core_params("lru", {"request_ranks": 0.0}) == {"request_ranks": 0.0}
    assert core_params("tenure", None) is None  # no LRU ranks to set
