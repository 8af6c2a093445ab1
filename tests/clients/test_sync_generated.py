"""The sync session is generated from the async one: the checked-in file must be current."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sync_session_is_generated_from_the_async_source() -> None:
    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_sync_session.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    expected = gen.generate()
    assert (ROOT / "clients" / "session.py").read_text() == expected, (
        "clients/session.py is stale or was edited by hand: edit clients/async_session.py, "
        "then run .venv/bin/python scripts/gen_sync_session.py"
    )
    # The twins differ only in I/O colour: no coroutine leaks into the sync file.
    assert "await " not in expected and "async def" not in expected
