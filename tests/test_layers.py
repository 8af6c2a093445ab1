"""The import graph points down the layers of ARCHITECTURE.md, and has no cycle.

A small AST walk over every module of the packages: each ``import`` / ``from ... import``
(function-level and ``TYPE_CHECKING`` ones included: they are dependencies all the same) is
an edge. A module may import its own group and groups of a lower layer, never a group of its
own layer or above; the engine adapter imports only the core, the wire formats and the errors;
test helpers are imported by tests only; and no chain of imports comes back to where it
started. A class of the sidecar or the adapter does not subclass a project class of another
module (a class spread over files through base classes), except the real is-a relations of
:data:`ALLOWED_BASES`. Everything is imported through the one root ``tenure``
(``tenure.service...``), never by the bare folder names, and the wheel installs ``tenure`` alone
(issue 22: no generic ``service`` or ``clients`` in site-packages).
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The one import root (``tenure/``: symlinks to the top-level folders, see ARCHITECTURE.md).
ROOT = "tenure"
#: The folders it maps: ``service/`` is imported as ``tenure.service`` and so on.
PACKAGES = ("service", "engine_adapter", "clients", "benchmarks")

#: Groups of modules by layer, bottom first (a group: a module and everything under it).
#: Longest prefix wins; CLI modules (``cli`` / ``*_cli``) are always the top layer.
LAYERS: list[tuple[str, ...]] = [
    # 0: the pure decision core, the shared errors, stand-alone tools
    (
        "tenure.service.policy",
        "tenure.service.errors",
        "tenure.service.tools",
        "tenure.service.processes",
        "tenure.service.harness",
        "tenure.service",
    ),
    # 1: wire and record formats shared by the sidecar, the push channel and the adapter; the SDK
    ("tenure.service.wire", "tenure.clients"),
    # 2: the Redis state, settings, metrics; the simulator; calibration; the engine adapter
    (
        "tenure.service.state",
        "tenure.service.settings",
        "tenure.service.metrics",
        "tenure.service.replay",
        "tenure.service.calibrate",
        "tenure.engine_adapter",
    ),
    # 3: the push channel's server
    ("tenure.service.push",),
    # 4-11: the sidecar (tenure.service.api), its rooms bottom first: the error bodies and the
    # tenants; the upstream hop and the request's hints; the per-API shapes; segments and retention;
    # turns and their lifecycle; the one proxy pipeline; the HTTP routes; the connections
    ("tenure.service.api.errors", "tenure.service.api.tenants"),
    ("tenure.service.api.upstream", "tenure.service.api.hints"),
    ("tenure.service.api.shapes",),
    ("tenure.service.api.segments", "tenure.service.api.retention"),
    ("tenure.service.api.turns",),
    ("tenure.service.api.proxy",),
    ("tenure.service.api.routes",),
    ("tenure.service.api",),
    # 12: the application
    ("tenure.service.app",),
    # 13: the local-stack launcher
    ("tenure.service.stack",),
    # 14: the live A/B harness on the stack, and the benchmarks: imported by the CLI only
    ("tenure.service.live", "tenure.benchmarks"),
    # 15: the command line (``tenure`` and each package's ``cli`` / ``*_cli`` module)
    ("<cli>",),
]
#: What the engine adapter may import of the rest of the house (besides vLLM and itself).
ADAPTER_MAY_IMPORT = (
    "tenure.service.policy",
    "tenure.service.wire",
    "tenure.service.errors",
    "tenure.engine_adapter",
)
#: What the SDK may import (it ships to harnesses on its own).
SDK_MAY_IMPORT = ("tenure.clients",)
TEST_HELPERS = ("tenure.engine_adapter.testing",)
#: Where classes may not extend a project class of another module.
NO_CROSS_MODULE_BASES = ("tenure.service", "tenure.engine_adapter")
#: Project classes that classes of other modules may extend: real is-a relations, not one
#: class cut into files (collaborators are composed and passed in; ARCHITECTURE.md).
ALLOWED_BASES: dict[str, str] = {
    # The decision core's contracts: every core policy is a TierPolicy (the narrow ABC with
    # the all-or-nothing contract that the replay, the sidecar and the adapter call), every
    # placement policy a PlacementPolicy.
    "tenure.service.policy.base.TierPolicy": "the core policy ABC",
    "tenure.service.policy.placement.PlacementPolicy": "the placement policy ABC",
    # The family of policies that decide by sessions (tenure's gate, Mori, Marconi, the
    # oracle, TTL pinning) share one lifecycle book, reclaim and host TTL, and each is used
    # wherever a SessionPolicy is (the replay's and the adapter's session hints).
    "tenure.service.policy.sessions.SessionPolicy": "the session-lifecycle policy family",
    # Exception hierarchy: a workload's scale error is a usage error (one exit path).
    "tenure.service.errors.UsageError": "exception hierarchy",
    # The replay's ObservedTier is a HostTier that also reports residency changes; it is
    # passed wherever the core's HostTier is.
    "tenure.service.policy.tier.HostTier": "a HostTier that reports to the replay's books",
    # vLLM's OffloadingSpec / OffloadingWorker families (vLLM loads them by class): the CPU
    # spec is Tenure's spec with the host-copy worker; the tiering spec's worker is the
    # host-copy worker with its pool in a shared region.
    "tenure.engine_adapter.spec.TenureOffloadingSpec": "vLLM OffloadingSpec family",
    "tenure.engine_adapter.cpu_spec.HostCopyWorker": "vLLM OffloadingWorker family",
    # The live A/B stack is a local stack (the A/B's settings and model on the same launcher).
    "tenure.service.stack.StackConfig": "the A/B stack's settings are stack settings",
    "tenure.service.stack.LocalStack": "the A/B stack is a local stack",
}


def _module_name(path: Path) -> str:
    parts = [ROOT, *path.relative_to(REPO).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target, node.lineno
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    yield sub, node.lineno


def _edges() -> dict[str, set[tuple[str, int]]]:
    known = _modules()
    edges: dict[str, set[tuple[str, int]]] = {}
    for name, path in known.items():
        out = edges.setdefault(name, set())
        for target, line in _imports(name, path, known):
            if target.split(".")[0] == ROOT and target != name:
                # ``import a.b.c`` depends on the deepest module of it the tree has.
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                if target in known and target != name:
                    out.add((target, line))
    return edges


def _is_cli(name: str) -> bool:
    last = name.rpartition(".")[2]
    return last == "cli" or last.endswith("_cli")


def _group(name: str) -> tuple[int, str]:
    """(layer, group) of a module: its longest matching group prefix."""
    if _is_cli(name):
        return len(LAYERS) - 1, "<cli>"
    best: tuple[int, str] | None = None
    for layer, groups in enumerate(LAYERS):
        for group in groups:
            if (name == group or name.startswith(group + ".")) and (
                best is None or len(group) > len(best[1])
            ):
                best = (layer, group)
    assert best is not None, f"{name} is in no layer: add its group to LAYERS"
    return best


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_every_import_points_down_the_layers() -> None:
    wrong = []
    for source, targets in sorted(_edges().items()):
        layer, group = _group(source)
        for target, line in sorted(targets):
            t_layer, t_group = _group(target)
            if t_group == group:
                continue
            if t_layer >= layer:
                wrong.append(
                    f"{source}:{line} imports {target} "
                    f"(layer {layer} {group} -> layer {t_layer} {t_group})"
                )
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_the_adapter_and_the_sdk_import_only_what_they_may() -> None:
    wrong = []
    for source, targets in sorted(_edges().items()):
        allowed: tuple[str, ...] | None = None
        if _under(source, ("tenure.engine_adapter",)) and not _under(source, TEST_HELPERS):
            allowed = ADAPTER_MAY_IMPORT
        elif _under(source, ("tenure.clients",)):
            allowed = SDK_MAY_IMPORT
        if allowed is None:
            continue
        wrong += [f"{source}:{line} imports {t}" for t, line in targets if not _under(t, allowed)]
    assert not wrong, "\n".join(sorted(wrong))


def test_test_helpers_are_imported_by_tests_only() -> None:
    wrong = [
        f"{source}:{line} imports {target}"
        for source, targets in _edges().items()
        if not _under(source, TEST_HELPERS)
        for target, line in targets
        if _under(target, TEST_HELPERS)
    ]
    assert not wrong, "\n".join(sorted(wrong))


def test_the_import_graph_has_no_cycle() -> None:
    graph = {s: {t for t, _ in ts} for s, ts in _edges().items()}
    # Tarjan's strongly connected components: any with two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _class_bases(known: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(class, base) for every class of ``known`` with a project class of another module as a
    base, both as ``module.Class`` (a re-exported base resolved to the module defining it)."""
    trees = {name: ast.parse(path.read_text(), filename=str(path)) for name, path in known.items()}
    defined: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, set()).add(name)
    for name, tree in trees.items():
        imported: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    imported[alias.asname or alias.name] = node.module
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for base in node.bases:
                if isinstance(base, ast.Subscript):  # Generic[T]-style bases
                    base = base.value
                if isinstance(base, ast.Attribute):  # ``module.Class``
                    source, cls = ast.unparse(base.value), base.attr
                elif isinstance(base, ast.Name) and base.id in imported:
                    source, cls = imported[base.id], base.id
                else:
                    continue  # defined in this module, a builtin, or not the project's
                if source.split(".")[0] != ROOT:
                    continue
                homes = defined.get(cls, set())
                home = source if source in homes else min(homes, default=source)
                if home != name:
                    yield f"{name}.{node.name}", f"{home}.{cls}"


def test_no_class_is_spread_over_modules_through_base_classes() -> None:
    wrong = [
        f"{cls} extends {base}"
        for cls, base in _class_bases(_modules())
        if _under(cls.rpartition(".")[0], NO_CROSS_MODULE_BASES) and base not in ALLOWED_BASES
    ]
    assert not wrong, (
        "compose collaborators instead of extending a class of another module (or add a real "
        "is-a relation to ALLOWED_BASES, with why):\n" + "\n".join(sorted(wrong))
    )


def test_the_base_class_check_sees_a_split_class(tmp_path: Path) -> None:
    # Guards the check itself: a class extending another module's class is found, an allowed
    # base and a same-module base are not.
    (tmp_path / "service").mkdir()
    (tmp_path / "service" / "part.py").write_text("class Part:\n    pass\n")
    (tmp_path / "service" / "whole.py").write_text(
        "from tenure.service.part import Part\n"
        "from tenure.service.errors import UsageError\n"
        "class Local:\n    pass\n"
        "class Whole(Part):\n    pass\n"
        "class Near(Local):\n    pass\n"
        "class Bad(UsageError):\n    pass\n"
    )
    (tmp_path / "service" / "errors.py").write_text("class UsageError(Exception):\n    pass\n")
    known = {f"tenure.service.{p.stem}": p for p in (tmp_path / "service").glob("*.py")}
    found = sorted(_class_bases(known))
    assert found == [
        ("tenure.service.whole.Bad", "tenure.service.errors.UsageError"),
        ("tenure.service.whole.Whole", "tenure.service.part.Part"),
    ]
    assert [c for c, b in found if b not in ALLOWED_BASES] == ["tenure.service.whole.Whole"]
    # The real tree: the allow-list names only classes that exist and are extended.
    extended = {b for _, b in _class_bases(_modules())}
    assert set(ALLOWED_BASES) <= extended


def test_the_walk_sees_the_whole_house() -> None:
    # Guards the test itself: a walk that found nothing would pass everything above.
    edges = _edges()
    assert len(edges) > 140
    assert any(t == "tenure.service.wire.push" for t, _ in edges["tenure.service.push.server"])
    for name in edges:
        _group(name)


#: Where Python code of the repository lives, besides the packages themselves.
ELSEWHERE = ("tests", "docs", "scripts")
#: A module-path string that starts at a bare folder name (optionally with ``:attribute``).
BARE_PATH = re.compile(rf"^(?:{'|'.join(PACKAGES)})\.[A-Za-z_][\w.]*(?::\w+)?$")


def _python_files() -> Iterator[Path]:
    for folder in (*PACKAGES, *ELSEWHERE):
        yield from (REPO / folder).rglob("*.py")


def test_nothing_imports_the_bare_folder_names() -> None:
    # ``service`` is importable in a checkout (the repository root is on the path), but it is a
    # second copy of every module: the bare copy's ``UsageError`` is not
    # ``tenure.service.errors.UsageError``. And the wheel has no ``service`` at all.
    wrong = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # Module paths in strings: entry points, ``-m`` targets, monkeypatch targets.
                if BARE_PATH.match(node.value):
                    wrong.append(f"{where}:{node.lineno} names {node.value!r}")
                continue
            else:
                continue
            wrong += [
                f"{where}:{node.lineno} imports {name}"
                for name in names
                if name.split(".")[0] in PACKAGES
            ]
    assert not wrong, "import through tenure.*:\n" + "\n".join(sorted(wrong))


def test_the_import_root_maps_the_folders_by_relative_links() -> None:
    # Relative, so a copy of the tree (a Docker build context, a worktree) keeps them working.
    for package in PACKAGES:
        link = REPO / ROOT / package
        assert link.is_symlink(), f"{link} must be a symlink to ../{package}"
        assert os.readlink(link) == f"../{package}", os.readlink(link)
        assert link.resolve() == (REPO / package).resolve()


def test_the_wheel_installs_only_the_tenure_name(tmp_path: Path) -> None:
    # Built from a copy of what the Dockerfiles copy (symlinks kept as symlinks), so the build
    # leaves nothing in the checkout.
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in (ROOT, *PACKAGES):
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=ignore)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("tenure-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        entry_points = archive.read(info).decode()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {ROOT}, f"the wheel installs {sorted(top)} at the top of site-packages"
    assert not top & {"service", "clients", "benchmarks", "engine_adapter"}
    for package in PACKAGES:
        assert f"{ROOT}/{package}/__init__.py" in names, package
    # Sub-packages and the typing markers travel too.
    assert f"{ROOT}/service/api/proxy/pipeline.py" in names
    assert {f"{ROOT}/py.typed", f"{ROOT}/service/py.typed", f"{ROOT}/clients/py.typed"} <= set(
        names
    )
    # The console script and the vLLM plugin point into the root.
    assert "tenure = tenure.service.cli:main" in entry_points
    assert "tenure = tenure.engine_adapter.plugin:register" in entry_points
