"""MkDocs hooks: the generated reference pages, and the repository's own Markdown in the site.

``on_files`` adds, before the navigation is built:

* the reference pages of :mod:`gen_reference`, rendered from the live objects (settings,
  metrics, the CLI, the OpenAPI schema, hints and dialects), and ``reference/openapi.json``;
* every repository file a page links to that is not a docs file, at its repository path
  (``results/ladder/README.md``, ``engine_adapter/README.md``, a plot, a JSON result), and
  then every file those link to, until nothing new is linked. A page links a repository file
  by its site path, which is its repository path; so the results, the adapter's and the
  SDK's READMEs are published as they are in the repository (their authors keep editing them
  there) and a link to a file that does not exist stays broken, which ``--strict`` fails on.
"""

from __future__ import annotations

import json
import posixpath
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

REPO = Path(__file__).resolve().parents[2]
# The pages document this checkout's code, whatever else the environment has installed.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(REPO)]

import gen_reference  # noqa: E402

#: A Markdown link or image target (``[x](target "title")``), or an HTML ``src``/``href``.
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)|(?:src|href)=\"([^\"]+)\"")
#: Repository files larger than this are linked to, never copied (none is today).
_MAX_BYTES = 8 * 1024 * 1024


def _targets(markdown: str, page: str) -> set[str]:
    """The site paths ``page``'s relative links point at (anchors and queries dropped)."""
    found = set()
    in_fence = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        if in_fence:
            continue
        for match in _LINK.finditer(line):
            target = (match.group(1) or match.group(2) or "").split("#")[0].split("?")[0]
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                continue
            path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
            if not path.startswith(".."):
                found.add(path)
    return found


def _reference_pages(config: MkDocsConfig) -> list[File]:
    schema = gen_reference.openapi_schema()
    pages = {path: render() for path, render in gen_reference.PAGES.items()}
    pages["reference/http-api.md"] = gen_reference.openapi_markdown(schema)
    pages["reference/hints.md"] = gen_reference.hints_markdown(schema)
    pages["reference/openapi.json"] = json.dumps(schema, indent=2)
    return [File.generated(config, path, content=text) for path, text in pages.items()]


def _nav_paths(nav: Any) -> Iterator[str]:
    if isinstance(nav, str):
        yield nav
    elif isinstance(nav, list):
        for item in nav:
            yield from _nav_paths(item)
    elif isinstance(nav, dict):
        for item in nav.values():
            yield from _nav_paths(item)


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    for generated in _reference_pages(config):
        files.append(generated)
    queue: list[File | None] = [None, *files.documentation_pages()]
    while queue:
        page = queue.pop()
        # None stands for the navigation, which names repository pages by their path too.
        wanted = (
            set(_nav_paths(config["nav"]))
            if page is None
            else _targets(page.content_string, page.src_uri)
        )
        for path in sorted(wanted):
            source = REPO / path
            if files.get_file_from_path(path) is not None or not source.is_file():
                continue  # a docs file, or broken: mkdocs reports it
            if source.stat().st_size > _MAX_BYTES or ".venv" in source.parts:
                continue
            if path.endswith(".md"):
                mirrored = File.generated(config, path, content=source.read_text())
                queue.append(mirrored)
            else:
                mirrored = File.generated(config, path, abs_src_path=str(source))
            files.append(mirrored)
    return files
