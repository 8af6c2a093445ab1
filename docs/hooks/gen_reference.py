"""The documentation's reference pages, generated from the live objects at build time.

Each ``*_markdown`` function renders one page from the object the running code uses: the
settings model (walked recursively, nested settings models included), the metrics registry a
sidecar builds, the ``tenure`` command's argparse parsers, the app's OpenAPI schema and the hint
dialects module. Nothing is copied by hand, so the pages cannot drift from the code; a moved
module fails the strict build with the name to change in :data:`SOURCES`.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import re
import textwrap
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

#: Where each generated page reads from: the one place to edit when a module moves.
SOURCES = {
    "settings": "tenure.service.settings:Settings",
    "load_settings": "tenure.service.settings:load_settings",
    "runtime_config": "tenure.service.state.config:RuntimeConfig",
    "metrics": "tenure.service.metrics:Metrics",
    "cli": "tenure.service.cli:build_parser",
    "app": "tenure.service.app:create_app",
    # Where issue 22's layout puts it, then where it was before.
    "dialects": "tenure.service.api.hints.dialects | tenure.service.api.dialects",
}


def load(name: str) -> Any:
    """The object :data:`SOURCES` names (``module:attribute``, or a module; ``a | b``: the
    first that imports)."""
    candidates = [c.strip() for c in SOURCES[name].split("|")]
    for candidate in candidates:
        module_name, _, attribute = candidate.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if candidate == candidates[-1] or not module_name.startswith(str(error.name)):
                raise
            continue
        return getattr(module, attribute) if attribute else module
    raise AssertionError("unreachable")


def _text(text: object) -> str:
    """Text on one line of Markdown (reST's double backticks become Markdown's)."""
    return " ".join(str(text).split()).replace("``", "`")


def _cell(text: object) -> str:
    """Text fit for one Markdown table cell (reST's double backticks become Markdown's)."""
    return " ".join(str(text).split()).replace("``", "`").replace("|", "\\|")


# --- settings ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SettingRow:
    env: str
    type: str
    default: str
    doc: str
    #: The nested settings model the field sits in ("" at the top level).
    group: str


def _field_comments(cls: type) -> dict[str, str]:
    """Each field's ``#:`` comment block (Sphinx's convention, used by the settings classes)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        if stripped.startswith("#"):
            continue  # a plain comment (why, not what) between the doc and its field
        found = re.match(r"^    (\w+)\s*:", line)
        if found and pending:
            comments[found.group(1)] = " ".join(pending)
        if stripped:
            pending = []
    return comments


def _field_sections(cls: type) -> dict[str, str]:
    """Each field's section: the ``# --- title ---`` comment above it, if the class has them."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    sections: dict[str, str] = {}
    current = ""
    for line in source.splitlines()[1:]:
        heading = re.match(r"^    # -{3}\s*(.*?)\s*-*\s*$", line)
        if heading:
            current = heading.group(1)
            continue
        found = re.match(r"^    (\w+)\s*:", line)
        if found and current:
            sections[found.group(1)] = current
    return sections


def _source_defaults(cls: type) -> dict[str, str]:
    """Each field's default as written in the source (``32 * 1024 * 1024``), for display."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    written: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "Field":
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        # Arithmetic says more than its value (``32 * 1024 * 1024``); a call or a literal not.
        if isinstance(value, ast.BinOp):
            written[node.target.id] = ast.unparse(value)
    return written


def _docs(cls: type) -> dict[str, str]:
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        docs.update(_field_comments(klass))
    return docs


def type_name(annotation: Any) -> str:
    """A reader's spelling of a type: ``int``, ``str | None``, ``'raw' | 'aiohttp'``."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join(type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    if annotation is SecretStr:
        return "secret"
    return getattr(annotation, "__name__", str(annotation))


def _constraints(info: FieldInfo) -> str:
    marks = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    found = []
    for item in info.metadata:
        for attribute, sign in marks.items():
            value = getattr(item, attribute, None)
            if value is not None:
                found.append(f"{sign} {value}")
    return ", ".join(found)


def _default(info: FieldInfo, written: str | None) -> str:
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, SecretStr):
        # A default is in the source for all to read; it is never a deployment's secret.
        value = value.get_secret_value()
    if isinstance(value, BaseModel):
        value = value.model_dump()
    shown = json.dumps(value) if isinstance(value, dict | list | str) else repr(value)
    if value == "":
        shown = '"" (empty)'
    if written and written != shown:
        shown = f"{shown} (`{written}`)"
    return shown


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation names, through ``X | None``."""
    candidates = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else ()
    for candidate in (annotation, *candidates):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def setting_rows(model: type[BaseModel]) -> list[SettingRow]:
    """Every environment variable ``model`` reads, walking nested settings models.

    A field typed with a ``BaseSettings`` class is a group read with that class's own
    ``env_prefix``; a field typed with a plain model is a group under the parent's
    ``env_nested_delimiter`` when it has one, else one variable holding JSON.
    """
    config = model.model_config
    prefix = str(config.get("env_prefix", "") or "")
    return list(_walk(model, prefix, _delimiter(config), ""))


def _delimiter(config: Any) -> str | None:
    value = config.get("env_nested_delimiter")
    return str(value) if value else None


def _walk(
    model: type[BaseModel], prefix: str, delimiter: str | None, group: str
) -> Iterator[SettingRow]:
    docs, written, sections = _docs(model), _source_defaults(model), _field_sections(model)
    for name, info in model.model_fields.items():
        nested = _model_of(info.annotation)
        # A nested model is its own group (named by its top-level field); a flat model's
        # fields are grouped by the section comments of the class, when it has them.
        label = group or name
        if nested is not None and issubclass(nested, BaseSettings):
            sub = nested.model_config
            yield from _walk(nested, str(sub.get("env_prefix", "") or ""), _delimiter(sub), label)
            continue
        if nested is not None and delimiter:
            yield from _walk(nested, f"{prefix}{name}{delimiter}", delimiter, label)
            continue
        alias = info.validation_alias if isinstance(info.validation_alias, str) else info.alias
        env = (alias or f"{prefix}{name}").upper()
        kind = type_name(info.annotation)
        if nested is not None:
            kind = f"JSON ({kind}: {', '.join(nested.model_fields)})"
        limits = _constraints(info)
        if limits:
            kind = f"{kind} ({limits})"
        doc = info.description or docs.get(name, "")
        yield SettingRow(
            env, kind, _default(info, written.get(name)), doc, group or sections.get(name, "")
        )


def settings_markdown(
    model: type[BaseModel] | None = None, runtime: type[BaseModel] | bool | None = None
) -> str:
    """The settings page; ``runtime=False`` leaves out the runtime configuration section."""
    model = model or load("settings")
    rows = setting_rows(model)
    out = [
        "# Settings",
        "",
        f"Every environment variable `tenure serve` reads: {len(rows)} settings, generated at",
        f"build time from `{model.__module__}:{model.__qualname__}` (pydantic-settings; nested",
        "settings models are walked), with each field's type, default and the comment above it",
        "in the code.",
        "Booleans take `1`/`0`, `true`/`false`; JSON-typed values are JSON text. A bad value is",
        "one line naming the variable at start-up, never a traceback (and never the value of a",
        "secret).",
        "",
    ]
    silent = [r.env for r in rows if not r.doc]
    if silent:
        out += [
            f"{len(silent)} settings have no comment in the code yet (their meaning reads `—`):",
            "a `#:` comment above the field, or a pydantic `description`, fills it in here.",
            "",
        ]
    groups: dict[str, list[SettingRow]] = {}
    for row in rows:
        groups.setdefault(row.group, []).append(row)
    for group, members in groups.items():
        if group:
            out += [f"## {group}", ""]
        out += ["| variable | type | default | meaning |", "|---|---|---|---|"]
        out += [
            f"| `{r.env}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.doc) or '—'} |"
            for r in members
        ]
        out.append("")
    if runtime is not False:
        out += runtime_config_lines(
            runtime if isinstance(runtime, type) else load("runtime_config")
        )
    return "\n".join(out)


def runtime_config_lines(model: type[BaseModel]) -> list[str]:
    """The runtime configuration document (in Redis, shared by every replica), which the
    admin API reads and patches: policy, host capacity, the retention controller's inputs."""
    docs, written = _docs(model), _source_defaults(model)
    out = [
        "## Runtime configuration (`PATCH /admin/config`)",
        "",
        "Not environment variables: one document in Redis, shared by every replica, read with",
        "`GET /admin/config` and changed at run time with `PATCH /admin/config` (admin token;",
        "only the fields sent change; a bad value is a 422 naming the field and changes",
        f"nothing). Generated from `{model.__module__}:{model.__qualname__}`.",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, info in model.model_fields.items():
        kind = type_name(info.annotation)
        limits = _constraints(info)
        if limits:
            kind = f"{kind} ({limits})"
        default = _default(info, written.get(name))
        doc = info.description or docs.get(name, "")
        out.append(f"| `{name}` | {_cell(kind)} | {_cell(default)} | {_cell(doc) or '—'} |")
    out.append("")
    return out


# --- metrics ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricRow:
    #: The name as ``/metrics`` exposes it (a counter's ``_total`` included).
    name: str
    type: str
    labels: tuple[str, ...]
    doc: str


def metric_rows(metrics_class: Callable[..., Any] | None = None) -> list[MetricRow]:
    """Every metric one sidecar's registry holds (built on a fresh registry, as the app does)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry()
    (metrics_class or load("metrics"))(registry)
    # The registry keeps its collectors in a private map; the label names of a labelled
    # metric are known only to its wrapper object (a family without samples lists none).
    collectors = {id(c): c for c in registry._names_to_collectors.values()}.values()
    rows: list[MetricRow] = []
    for collector in collectors:
        labels = tuple(getattr(collector, "_labelnames", ()))
        describe = getattr(collector, "describe", None)
        families = describe() if describe is not None else list(collector.collect())
        for family in families:
            name = family.name + ("_total" if family.type == "counter" else "")
            rows.append(MetricRow(name, family.type, labels, family.documentation))
    return sorted(rows, key=lambda r: r.name)


def metrics_markdown(metrics_class: Callable[..., Any] | None = None) -> str:
    rows = metric_rows(metrics_class)
    out = [
        "# Metrics",
        "",
        f"Every metric on a sidecar's `/metrics`: {len(rows)} families, generated at build time",
        f"from the registry `{SOURCES['metrics']}` builds. Histograms expose `_bucket`, `_sum`",
        "and `_count`; counters also `_created`. Labels never take client or adapter text as it",
        "is: values outside a label's known set or budget are `other`. The engine's own `vllm:*`",
        "metrics (the dashboard's last rows) are vLLM's and the adapter's: see",
        "[Dashboards](../operations/dashboards.md).",
        "",
        "| metric | type | labels | meaning |",
        "|---|---|---|---|",
    ]
    out += [
        f"| `{r.name}` | {r.type} | {', '.join(f'`{x}`' for x in r.labels) or '—'} "
        f"| {_cell(r.doc)} |"
        for r in rows
    ]
    return "\n".join(out) + "\n"


# --- the command line -------------------------------------------------------------------


@dataclass
class Option:
    flags: tuple[str, ...]
    metavar: str
    default: str
    help: str
    required: bool


@dataclass
class Command:
    path: tuple[str, ...]
    usage: str
    description: str
    help: str
    options: list[Option] = field(default_factory=list)
    children: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " ".join(("tenure", *self.path))

    @property
    def anchor(self) -> str:
        return "cli-" + ("-".join(self.path) or "tenure")


def _subcommands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def _expand(text: str | None, action: argparse.Action, prog: str) -> str:
    if not text or text == argparse.SUPPRESS:
        return ""
    try:
        return text % {**vars(action), "prog": prog}
    except (KeyError, TypeError, ValueError):
        return text


def _options(parser: argparse.ArgumentParser) -> list[Option]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:
            continue
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) else repr(default)
        if isinstance(default, str):
            shown = f"`{default}`" if default else ""
        metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
        if action.choices is not None and not isinstance(action.choices, dict):
            metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
        if action.nargs == 0:
            metavar = ""
        flags = tuple(action.option_strings) or (action.dest,)
        found.append(
            Option(
                flags,
                str(metavar),
                shown,
                _expand(action.help, action, parser.prog),
                action.required,
            )
        )
    return found


def cli_commands(build_parser: Callable[[Sequence[str]], argparse.ArgumentParser] | None = None
                 ) -> list[Command]:  # fmt: skip
    """Every command of ``tenure``, depth first, each with its flags.

    The CLI configures a command's parser only when that command is named (so ``tenure
    replay`` never imports the web stack); so each command's parser is built by asking for it.
    """
    build = build_parser or load("cli")
    commands: list[Command] = []

    def visit(path: tuple[str, ...], help_text: str) -> None:
        node = build(list(path))
        for name in path:
            sub = _subcommands(node)
            assert sub is not None
            node = sub.choices[name]
        command = Command(path, node.format_usage().strip(), node.description or "", help_text,
                          _options(node))  # fmt: skip
        commands.append(command)
        sub = _subcommands(node)
        if sub is None:
            return
        helps = {a.dest: a.help or "" for a in sub._choices_actions}
        for name in sub.choices:
            command.children.append(name)
            visit((*path, name), helps.get(name, ""))

    visit((), "")
    return commands


def cli_markdown(build_parser: Callable[[Sequence[str]], argparse.ArgumentParser] | None = None
                 ) -> str:  # fmt: skip
    commands = cli_commands(build_parser)
    flags = sum(len(c.options) for c in commands)
    out = [
        "# Command line",
        "",
        f"Every `tenure` command and flag: {len(commands)} commands, {flags} flags and",
        f"arguments, generated at build time from the argparse parsers of `{SOURCES['cli']}`.",
        "A flag a user can get wrong is one line on stderr and exit code 2.",
        "",
    ]
    for command in commands:
        level = "#" * min(2 + max(len(command.path) - 1, 0), 4)
        out += [f"{level} `{command.name}` {{#{command.anchor}}}", ""]
        text = command.description or command.help
        if text:
            out += [text, ""]
        out += ["```text", command.usage, "```", ""]
        if command.children:
            links = ", ".join(
                f"[`{child}`](#{command.anchor}-{child})" if command.path
                else f"[`{child}`](#cli-{child})"
                for child in command.children
            )  # fmt: skip
            out += [f"Commands: {links}.", ""]
        if command.options:
            out += ["| flag | value | default | meaning |", "|---|---|---|---|"]
            for option in command.options:
                name = ", ".join(f"`{f}`" for f in option.flags)
                value = f"`{option.metavar}`" if option.metavar else ""
                meaning = _cell(option.help) + (" (required)" if option.required else "")
                out.append(f"| {name} | {_cell(value)} | {_cell(option.default)} | {meaning} |")
            out.append("")
    return "\n".join(out)


# --- the HTTP API -----------------------------------------------------------------------


def openapi_schema() -> dict[str, Any]:
    """The sidecar app's OpenAPI schema (a dev-mode app: nothing is connected to build it)."""
    settings = load("load_settings")(dev_mode=True, push_addr="")
    schema: dict[str, Any] = load("app")(settings).openapi()
    return schema


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " \\| ".join(_schema_text(s) for s in schema[key])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = " \\| ".join(kind)
    if "enum" in schema:
        return " \\| ".join(f"`{v}`" for v in schema["enum"])
    if kind == "array" and "items" in schema:
        return f"array of {_schema_text(schema['items'])}"
    return f"`{kind}`"


def openapi_markdown(schema: dict[str, Any] | None = None) -> str:
    schema = schema or openapi_schema()
    paths: dict[str, Any] = schema["paths"]
    out = [
        "# HTTP API",
        "",
        f"Every route of `tenure serve`: {len(paths)} paths, generated at build time from the",
        "app's own OpenAPI schema (the proxied routes included, with every answer the sidecar",
        "itself gives). The same schema is served live at `/openapi.json` (and `/docs`), and",
        "is here as [openapi.json](openapi.json). Errors: the proxied `/v1` routes answer in",
        "the OpenAI API's style (`/v1/messages` in Anthropic's); lifecycle and admin routes in",
        "one shape, that `error` object plus `detail`.",
        "",
    ]
    for path, methods in paths.items():
        for method, operation in methods.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            out += [f"## `{method.upper()} {path}`", ""]
            if operation.get("summary"):
                out += [f"**{operation['summary']}.**", ""]
            if operation.get("description"):
                out += [operation["description"], ""]
            params = operation.get("parameters", [])
            if params:
                out += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
                for p in params:
                    required = " (required)" if p.get("required") else ""
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {_schema_text(p.get('schema', {}))} "
                        f"| {_cell(p.get('description', ''))}{required} |"
                    )
                out.append("")
            body = operation.get("requestBody", {}).get("content", {})
            for content_type, content in body.items():
                out += [f"Body (`{content_type}`): {_schema_text(content.get('schema', {}))}", ""]
            responses = operation.get("responses", {})
            if responses:
                out += ["| answer | meaning |", "|---|---|"]
                for code, answer in responses.items():
                    shapes = {
                        _schema_text(c.get("schema", {}))
                        for c in answer.get("content", {}).values()
                        if c.get("schema")
                    }
                    shape = f" ({', '.join(sorted(shapes))})" if shapes else ""
                    out.append(f"| {code} | {_cell(answer.get('description', ''))}{shape} |")
                out.append("")
    out += ["## Schemas", ""]
    for name, body in schema.get("components", {}).get("schemas", {}).items():
        out += [f"### {name} {{#schema-{name.lower()}}}", ""]
        if body.get("description"):
            out += [_cell(body["description"]), ""]
        properties = body.get("properties", {})
        if properties:
            needed = set(body.get("required", []))
            out += ["| field | type | meaning |", "|---|---|---|"]
            for prop, spec in properties.items():
                flag = " (required)" if prop in needed else ""
                meaning = _cell(spec.get("description", spec.get("title", "")))
                out.append(f"| `{prop}`{flag} | {_schema_text(spec)} | {meaning} |")
            out.append("")
    return "\n".join(out)


# --- hints and dialects -----------------------------------------------------------------


def _rst_to_markdown(text: str) -> str:
    """A docstring's reST literals (double backticks) as Markdown's single ones."""
    return text.replace("``", "`")


def hint_headers(schema: dict[str, Any]) -> dict[str, str]:
    """Each ``X-Tenure-*`` header the tracked routes accept, with its meaning."""
    found: dict[str, str] = {}
    for methods in schema["paths"].values():
        for operation in methods.values():
            for p in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if p.get("in") == "header" and p["name"].lower().startswith("x-tenure-"):
                    found.setdefault(p["name"], p.get("description", ""))
    return found


def hints_markdown(schema: dict[str, Any] | None = None, dialects: Any = None) -> str:
    schema = schema or openapi_schema()
    dialects = dialects or load("dialects")
    headers = hint_headers(schema)
    body = schema.get("components", {}).get("schemas", {}).get("TenureHints", {})
    out = [
        "# Hint headers and dialects",
        "",
        "Generated at build time from the OpenAPI schema's header parameters and `TenureHints`",
        f"body object, and from `{SOURCES['dialects']}`. How a harness uses them:",
        "[Harnesses](../harnesses.md).",
        "",
        "## Tenure's headers",
        "",
        "| header | meaning |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {_cell(text)} |" for name, text in headers.items()]
    out += ["", "## The `tenure` body object", ""]
    if body.get("description"):
        out += [_cell(body["description"]), ""]
    out += ["| field | type | meaning |", "|---|---|---|"]
    by_field = {h.lower().removeprefix("x-tenure-").replace("-", "_"): h for h in headers}
    for prop, spec in body.get("properties", {}).items():
        meaning = _cell(spec.get("description", ""))
        # A body field is its header's twin: session_id = session, expected_gap_s in seconds.
        twin = by_field.get(prop) or by_field.get(prop.removesuffix("_id"))
        if twin is None and prop.endswith("_s"):
            twin = by_field.get(prop[:-2] + "_ms")
            meaning = meaning or "in seconds"
        if twin is not None:
            meaning = f"as `{twin}`" + (f": {meaning}" if meaning else "")
        out.append(f"| `tenure.{prop}` | {_schema_text(spec)} | {meaning} |")
    out += ["", "## Other stacks' dialects", ""]
    out += [_rst_to_markdown(textwrap.dedent(dialects.__doc__ or "").strip()), ""]
    out += ["| header read | body key read |", "|---|---|"]
    header_names = sorted(dialects.DIALECT_HEADERS)
    body_keys = list(dialects.DIALECT_BODY_KEYS)
    for i in range(max(len(header_names), len(body_keys))):
        h = f"`{header_names[i]}`" if i < len(header_names) else ""
        b = f"`{body_keys[i]}`" if i < len(body_keys) else ""
        out.append(f"| {h} | {b} |")
    out += [
        "",
        "Every `(dialect, field)` pair the counter `tenure_dialect_fields_total` may carry (its",
        "`outcome` label: `used`, `overridden`, `ignored`, `unknown`):",
        "",
        "| dialect | field |",
        "|---|---|",
    ]
    out += [f"| `{d}` | `{f}` |" for d, f in sorted(dialects.DIALECT_FIELDS)]
    return "\n".join(out) + "\n"


# --- alerts -----------------------------------------------------------------------------

#: The shipped Prometheus rules (relative to the repository root).
RULES = "deploy/prometheus/rules.yml"


def alerts_markdown(rules_text: str | None = None) -> str:
    """The recording and alert rules, from the file Prometheus loads (and promtool tests)."""
    import yaml

    if rules_text is None:
        from pathlib import Path

        rules_text = (Path(__file__).resolve().parents[2] / RULES).read_text()
    groups = yaml.safe_load(rules_text)["groups"]
    records = [r for g in groups for r in g["rules"] if "record" in r]
    alerts = [r for g in groups for r in g["rules"] if "alert" in r]
    out = [
        "# Alerts",
        "",
        f"The {len(alerts)} alerts and {len(records)} recording rules shipped in `{RULES}`,",
        "generated at build time from that file (the one Prometheus loads; `promtool test rules`",
        "checks them in `tests/deploy/`). The dashboards and the alerts read the same recorded",
        "ratios, so they agree. Every metric they use: [Metrics](../reference/metrics.md).",
        "",
        "## Alerts",
        "",
    ]
    for rule in alerts:
        notes = rule.get("annotations", {})
        severity = rule.get("labels", {}).get("severity", "")
        out += [f"### {rule['alert']}", ""]
        out += [
            f"**{severity}**, after `{rule.get('for', '0s')}`. {_text(notes.get('summary', ''))}",
            "",
        ]
        if notes.get("description"):
            out += [_text(notes["description"]), ""]
        out += ["```promql", str(rule["expr"]).strip(), "```", ""]
    out += ["## Recording rules", "", "| rule | expression |", "|---|---|"]
    out += [f"| `{r['record']}` | `{_cell(r['expr']).replace('`', '')}` |" for r in records]
    return "\n".join(out) + "\n"


#: page path in the site -> the function that writes it.
PAGES: dict[str, Callable[[], str]] = {
    "reference/settings.md": settings_markdown,
    "reference/metrics.md": metrics_markdown,
    "reference/cli.md": cli_markdown,
    "operations/alerts.md": alerts_markdown,
}
