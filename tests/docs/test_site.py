"""The documentation site builds with ``--strict``, and its reference lists everything the code has.

The site is built once per module into a temporary directory, as ``make docs`` builds it. The
expected settings, metrics and CLI flags are read here from the live objects, independently of
the generator (``docs/hooks/gen_reference.py``), and each must appear in the built HTML page of
its reference: a setting, metric or flag the generator drops (or a page that stops being built)
fails the test. A broken link fails the build, and so this test.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from pydantic_settings import BaseSettings

from tenure.service.cli import build_parser
from tenure.service.metrics import Metrics
from tenure.service.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _mkdocs(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", *args], cwd=REPO, env=env, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = _mkdocs("build", "--strict", "--site-dir", str(out))
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def _text(page: Path) -> str:
    """The page's text as a reader sees it (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def _env_names(model: type[BaseModel], prefix: str, delimiter: str | None) -> Iterator[str]:
    """Every environment variable a settings model reads (nested settings models walked)."""
    for name, info in model.model_fields.items():
        kind = info.annotation
        nested = kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None
        if nested is not None and issubclass(nested, BaseSettings):
            config = nested.model_config
            yield from _env_names(
                nested, str(config.get("env_prefix") or ""), config.get("env_nested_delimiter")
            )
        elif nested is not None and delimiter:
            yield from _env_names(nested, f"{prefix}{name}{delimiter}", delimiter)
        else:
            alias = info.validation_alias if isinstance(info.validation_alias, str) else None
            yield (alias or f"{prefix}{name}").upper()


def test_every_setting_is_in_the_reference(site: Path) -> None:
    config = Settings.model_config
    expected = set(
        _env_names(
            Settings, str(config.get("env_prefix") or ""), config.get("env_nested_delimiter")
        )
    )
    assert len(expected) > 40  # the walk found the settings at all
    page = _text(site / "reference" / "settings" / "index.html")
    missing = sorted(name for name in expected if name not in page)
    assert not missing, f"settings missing from the reference: {missing}"


def test_every_metric_is_in_the_reference(site: Path) -> None:
    registry = CollectorRegistry()
    Metrics(registry)
    expected = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in registry.collect()
    }
    assert len(expected) > 40
    page = _text(site / "reference" / "metrics" / "index.html")
    missing = sorted(name for name in expected if name not in page)
    assert not missing, f"metrics missing from the reference: {missing}"


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[
    argparse.ArgumentParser
] | None:  # fmt: skip
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _flags() -> dict[tuple[str, ...], set[str]]:
    """Every command's path -> its option strings, from the live parsers."""
    found: dict[tuple[str, ...], set[str]] = {}

    def visit(path: tuple[str, ...]) -> None:
        node = build_parser(list(path))
        for name in path:
            sub = _subparsers(node)
            assert sub is not None
            node = sub.choices[name]
        found[path] = {
            flag
            for action in node._actions
            if not isinstance(action, argparse._HelpAction)
            for flag in action.option_strings
        }
        sub = _subparsers(node)
        for name in sub.choices if sub is not None else ():
            visit((*path, name))

    visit(())
    return found


def test_every_cli_command_and_flag_is_in_the_reference(site: Path) -> None:
    page = (site / "reference" / "cli" / "index.html").read_text()
    # One section per command, from its heading (its id is cli-<path>) to the next heading.
    sections = dict(
        re.findall(r'<h[234] id="(cli-[a-z0-9-]+)".*?>(.*?)(?=<h[234] id="cli-|\Z)', page, re.S)
    )
    commands = _flags()
    assert len(commands) > 20 and sum(map(len, commands.values())) > 100
    missing = []
    for path, flags in commands.items():
        anchor = "cli-" + ("-".join(path) or "tenure")
        if anchor not in sections:
            missing.append(" ".join(("tenure", *path)))
        # The flags table's first column (the usage line above it names every flag too).
        cells = re.findall(r"<tr>\s*<td>(.*?)</td>", sections.get(anchor, ""), re.S)
        listed = set(re.findall(r"-[-\w]+", html.unescape(" ".join(cells))))
        missing += [f"tenure {' '.join(path)} {flag}" for flag in flags if flag not in listed]
    assert not missing, f"missing from the CLI reference: {missing}"


def test_http_reference_lists_every_route(site: Path) -> None:
    from tenure.service.app import create_app
    from tenure.service.settings import load_settings

    schema = create_app(load_settings(dev_mode=True, push_addr="")).openapi()
    page = _text(site / "reference" / "http-api" / "index.html")
    missing = [
        f"{method.upper()} {path}"
        for path, methods in schema["paths"].items()
        for method in methods
        if f"{method.upper()} {path}" not in page
    ]
    assert not missing, f"routes missing from the HTTP reference: {missing}"


def test_hint_reference_lists_every_header(site: Path) -> None:
    page = _text(site / "reference" / "hints" / "index.html")
    headers = (
        "X-Tenure-Session",
        "X-Tenure-Last-Turn",
        "X-Tenure-Expected-Gap-Ms",
        "X-Tenure-Parent",
    )
    dialects = ("x-dynamo-session-id", "agent_hint", "prompt_cache_key")
    for name in (*headers, *dialects):
        assert name in page


def test_strict_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """The check is real: the same configuration with one broken link fails to build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n")
    config = tmp_path / "mkdocs.yml"
    source = (REPO / "mkdocs.yml").read_text()
    # Only the docs folder and the navigation change; the hooks and strictness stay.
    source = source.replace("docs_dir: docs", f"docs_dir: {docs}")
    source = re.sub(r"\nnav:.*", "\n", source, flags=re.S)
    source = source.replace("docs/hooks/mkdocs_hooks.py", str(REPO / "docs/hooks/mkdocs_hooks.py"))
    config.write_text(source)
    built = _mkdocs("build", "--strict", "-f", str(config), "--site-dir", str(tmp_path / "out"))
    assert built.returncode != 0
    assert "missing.md" in built.stderr


def test_readme_is_short_and_its_links_exist() -> None:
    """The front door: at most 150 lines, quick start, results and production set-up on the
    first screenful, and every relative link pointing at a file of the repository."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150
    first = "\n".join(lines[:80])
    for heading in ("## Quick start", "## Results", "## Production set-up", "make test"):
        assert heading in first
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", "\n".join(lines)):
        if not re.match(r"^[a-z]+:", target):
            assert (REPO / target).exists(), f"README links to a missing {target}"
