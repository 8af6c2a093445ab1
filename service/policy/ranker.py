"""The worker ranker: predicted sub-agent lifetime from what the harness knows at spawn.

Lachesis's predictive path needs only the *order* of live workers' lifetimes, predicted when
each is spawned. A :class:`SpawnRecord` holds the spawn metadata an agent harness has at that
moment (and the Claude Code trace records): the sub-agent type and model, the size of its
starting context and of its tool and system prompts, whether it runs in the background, and
where it sits in its session (the parent's turn, the parent's context size, its place in a
fan-out of siblings spawned together, the time since the session started).

Two rankers share one interface (``predict_lifetime_s``):

* :class:`RidgeRanker` — a linear model on standardised features predicting ``log`` lifetime,
  trained offline by ``tenure train-ranker`` (:mod:`tenure.service.policy.ranker_fit`) and saved as
  a small JSON artefact (no pickle): :meth:`RidgeRanker.load` / :meth:`RidgeRanker.to_json`.
* :class:`HeuristicRanker` — the documented fallback when no artefact is loaded: the median
  lifetime of the sub-agent's type as measured on the Claude Code trace (``Explore`` 115 s,
  ``general-purpose`` 298 s, ``Plan`` 367 s; anything else 136 s, the median over all 41
  sub-agents), ties broken by spawn order (the predictive path does that).

A bad artefact raises :class:`RankerArtefactError` with a one-line message. Pure: no I/O
besides :meth:`RidgeRanker.load` reading the file it is given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "ARTEFACT_FORMAT",
    "EXTENDED_FEATURES",
    "FEATURE_SETS",
    "NUMERIC_FEATURES",
    "HeuristicRanker",
    "RankerArtefactError",
    "RidgeRanker",
    "SpawnRecord",
    "WorkerRanker",
    "feature_vector",
    "model_family",
]

ARTEFACT_FORMAT = "tenure-worker-ranker"
#: Version 2 names its numeric features (``numeric_features``); version 1 artefacts, which
#: do not, use :data:`NUMERIC_FEATURES` and still load.
ARTEFACT_VERSION = 2
_VERSIONS = (1, 2)

#: Median recorded lifetime (seconds) per sub-agent type over the 41 sub-agents of
#: ``../shared/traces/claude_code/sessions.jsonl.gz`` (``duration_ms``, or the last inner call's
#: end for background agents that record none).
TYPE_MEDIAN_LIFETIME_S: Mapping[str, float] = {
    "Explore": 115.5,
    "general-purpose": 298.3,
    "Plan": 366.8,
}
ALL_MEDIAN_LIFETIME_S = 135.7

#: Numeric features, in vector order (categoricals follow, one-hot).
NUMERIC_FEATURES = (
    "log_context_tokens",
    "log_instruction_tokens",
    "log_tool_tokens",
    "log_system_tokens",
    "log_parent_turn",
    "log_parent_context_tokens",
    "log_session_elapsed_s",
    "fanout",
    "sibling_index",
    "background",
)
#: What else the harness knows at spawn, about the parent's spawning call and the session's
#: earlier workers (the ``extended`` feature set): the spawning call's output size (the
#: instructions it wrote), whether it reasoned, whether it answered a human turn, the gap
#: before it, how many workers the session spawned before and how many had returned, and the
#: mean ``log1p`` lifetime of those (0 when none had).
EXTENDED_FEATURES = (
    *NUMERIC_FEATURES,
    "log_parent_output_tokens",
    "parent_thinking",
    "parent_human_turn",
    "log_parent_gap_s",
    "workers_before",
    "workers_returned",
    "returned_log_lifetime",
)
FEATURE_SETS: Mapping[str, tuple[str, ...]] = {
    "base": NUMERIC_FEATURES,
    "extended": EXTENDED_FEATURES,
}
CATEGORICAL_FEATURES = ("subagent_type", "model_family")


class RankerArtefactError(ValueError):
    """The ranker artefact cannot be used (missing, not JSON, wrong format or shape)."""


@dataclass(frozen=True, slots=True)
class SpawnRecord:
    """What the harness knows when it spawns a sub-agent."""

    subagent_type: str = ""
    model: str = ""
    context_tokens: int = 0  # the worker's first request: system + tools + instruction
    tool_tokens: int = 0
    system_tokens: int = 0
    background: bool = False
    parent_turn: int = 0  # the parent's turn (call index) the spawn follows
    parent_context_tokens: int = 0
    fanout: int = 1  # workers spawned together (in one parent gap), itself included
    sibling_index: int = 0  # 0-based position in that fan-out
    session_elapsed_s: float = 0.0
    # The extended set (see EXTENDED_FEATURES).
    parent_output_tokens: int = 0  # the spawning call's output
    parent_thinking: bool = False
    parent_human_turn: bool = False  # the spawning call answered a human message
    parent_gap_s: float = 0.0  # the gap (tool run, human wait) before the spawning call
    workers_before: int = 0  # workers the session spawned earlier
    workers_returned: int = 0  # of those, returned before this spawn
    returned_mean_lifetime_s: float = 0.0  # their mean lifetime (geometric), 0 when none

    @property
    def instruction_tokens(self) -> int:
        return max(0, self.context_tokens - self.tool_tokens - self.system_tokens)

    def values(self) -> dict[str, float]:
        """Every numeric feature by name (:data:`EXTENDED_FEATURES` covers them all)."""
        return {
            "log_context_tokens": math.log1p(max(0, self.context_tokens)),
            "log_instruction_tokens": math.log1p(self.instruction_tokens),
            "log_tool_tokens": math.log1p(max(0, self.tool_tokens)),
            "log_system_tokens": math.log1p(max(0, self.system_tokens)),
            "log_parent_turn": math.log1p(max(0, self.parent_turn)),
            "log_parent_context_tokens": math.log1p(max(0, self.parent_context_tokens)),
            "log_session_elapsed_s": math.log1p(max(0.0, self.session_elapsed_s)),
            "fanout": float(max(1, self.fanout)),
            "sibling_index": float(max(0, self.sibling_index)),
            "background": 1.0 if self.background else 0.0,
            "log_parent_output_tokens": math.log1p(max(0, self.parent_output_tokens)),
            "parent_thinking": 1.0 if self.parent_thinking else 0.0,
            "parent_human_turn": 1.0 if self.parent_human_turn else 0.0,
            "log_parent_gap_s": math.log1p(max(0.0, self.parent_gap_s)),
            "workers_before": float(max(0, self.workers_before)),
            "workers_returned": float(max(0, self.workers_returned)),
            "returned_log_lifetime": math.log1p(max(0.0, self.returned_mean_lifetime_s))
            if self.workers_returned > 0
            else 0.0,
        }

    def numeric(self, names: Sequence[str] = NUMERIC_FEATURES) -> list[float]:
        values = self.values()
        return [values[n] for n in names]

    def categories(self) -> dict[str, str]:
        return {"subagent_type": self.subagent_type, "model_family": model_family(self.model)}


def model_family(model: str) -> str:
    """``claude-haiku-4-5-20251001`` -> ``haiku``; unknown names -> ``other``."""
    low = model.lower()
    for family in ("haiku", "sonnet", "opus", "qwen", "llama", "deepseek", "gpt"):
        if family in low:
            return family
    return "other" if low else ""


class WorkerRanker(Protocol):
    name: str

    def predict_lifetime_s(self, record: SpawnRecord) -> float: ...


def feature_vector(
    record: SpawnRecord,
    vocab: Mapping[str, Sequence[str]],
    numeric: Sequence[str] = NUMERIC_FEATURES,
) -> list[float]:
    """Numeric features, then one one-hot column per vocabulary value of each categorical."""
    vec = record.numeric(numeric)
    cats = record.categories()
    for name in CATEGORICAL_FEATURES:
        vec.extend(1.0 if cats.get(name) == v else 0.0 for v in vocab.get(name, ()))
    return vec


class HeuristicRanker:
    """Median lifetime of the sub-agent's type (see the module docstring)."""

    name = "heuristic-type"

    def __init__(
        self,
        table: Mapping[str, float] = TYPE_MEDIAN_LIFETIME_S,
        default_s: float = ALL_MEDIAN_LIFETIME_S,
    ) -> None:
        self.table = dict(table)
        self.default_s = default_s

    def predict_lifetime_s(self, record: SpawnRecord) -> float:
        return self.table.get(record.subagent_type, self.default_s)


class RidgeRanker:
    """Ridge regression on standardised spawn features, predicting log lifetime."""

    name = "ridge"

    def __init__(
        self,
        vocab: Mapping[str, Sequence[str]],
        mean: Sequence[float],
        scale: Sequence[float],
        weights: Sequence[float],
        intercept: float,
        alpha: float,
        meta: Mapping[str, Any] | None = None,
        numeric_features: Sequence[str] = NUMERIC_FEATURES,
    ) -> None:
        unknown = [n for n in numeric_features if n not in EXTENDED_FEATURES]
        if unknown:
            raise RankerArtefactError(f"ranker artefact: unknown feature(s) {unknown}")
        self.numeric_features = tuple(numeric_features)
        self.vocab = {k: list(v) for k, v in vocab.items()}
        width = len(self.numeric_features) + sum(len(v) for v in self.vocab.values())
        for label, values in (("mean", mean), ("scale", scale), ("weights", weights)):
            if len(values) != width:
                raise RankerArtefactError(
                    f"ranker artefact: {label} has {len(values)} values, features need {width}"
                )
        self.mean = [float(v) for v in mean]
        self.scale = [float(v) if float(v) > 0 else 1.0 for v in scale]
        self.weights = [float(v) for v in weights]
        self.intercept = float(intercept)
        self.alpha = float(alpha)
        self.meta = dict(meta or {})

    def features(self, record: SpawnRecord) -> list[float]:
        """The raw (unstandardised) feature vector: numeric, then one-hot categoricals."""
        return feature_vector(record, self.vocab, self.numeric_features)

    def feature_names(self) -> list[str]:
        names = list(self.numeric_features)
        for name in CATEGORICAL_FEATURES:
            names.extend(f"{name}={v}" for v in self.vocab.get(name, []))
        return names

    def predict_log(self, record: SpawnRecord) -> float:
        x = self.features(record)
        return self.intercept + sum(
            w * (v - m) / s
            for w, v, m, s in zip(self.weights, x, self.mean, self.scale, strict=True)
        )

    def predict_lifetime_s(self, record: SpawnRecord) -> float:
        return math.exp(min(self.predict_log(record), 700.0))

    # --- the artefact -------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {
            "format": ARTEFACT_FORMAT,
            "version": ARTEFACT_VERSION,
            "target": "log_lifetime_s",
            "features": self.feature_names(),
            "numeric_features": list(self.numeric_features),
            "vocab": self.vocab,
            "mean": self.mean,
            "scale": self.scale,
            "weights": self.weights,
            "intercept": self.intercept,
            "alpha": self.alpha,
            **self.meta,
        }

    def save(self, path: Path) -> None:
        path.write_text(
            json.dumps(self.to_json(), indent=1, sort_keys=True, allow_nan=False) + "\n",
            encoding="utf-8",
        )

    @classmethod
    def from_json(cls, doc: Any, where: str = "ranker artefact") -> RidgeRanker:
        if not isinstance(doc, dict):
            raise RankerArtefactError(f"{where}: expected a JSON object")
        if doc.get("format") != ARTEFACT_FORMAT:
            raise RankerArtefactError(f"{where}: not a {ARTEFACT_FORMAT} artefact")
        if doc.get("version") not in _VERSIONS:
            raise RankerArtefactError(
                f"{where}: version {doc.get('version')!r} unsupported (expected 1 or 2)"
            )
        vocab = doc.get("vocab")
        if not isinstance(vocab, dict) or set(vocab) != set(CATEGORICAL_FEATURES):
            raise RankerArtefactError(f"{where}: 'vocab' must map {list(CATEGORICAL_FEATURES)}")
        for key, values in vocab.items():
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise RankerArtefactError(f"{where}: vocab {key!r} must be a list of strings")
        numbers: dict[str, list[float]] = {}
        for key in ("mean", "scale", "weights"):
            values = doc.get(key)
            if not isinstance(values, list) or not all(_finite(v) for v in values):
                raise RankerArtefactError(f"{where}: {key!r} must be a list of finite numbers")
            numbers[key] = [float(v) for v in values]
        for key in ("intercept", "alpha"):
            if not _finite(doc.get(key)):
                raise RankerArtefactError(f"{where}: {key!r} must be a finite number")
        numeric = doc.get("numeric_features", list(NUMERIC_FEATURES))
        if doc.get("version") == 1:
            numeric = list(NUMERIC_FEATURES)
        if not isinstance(numeric, list) or not all(isinstance(v, str) for v in numeric):
            raise RankerArtefactError(f"{where}: 'numeric_features' must be a list of names")
        meta = {k: v for k, v in doc.items() if k in ("trained_on", "evaluation")}
        return cls(
            vocab,
            numbers["mean"],
            numbers["scale"],
            numbers["weights"],
            float(doc["intercept"]),
            float(doc["alpha"]),
            meta,
            numeric,
        )

    @classmethod
    def load(cls, path: Path) -> RidgeRanker:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise RankerArtefactError(
                f"{path}: cannot read ranker artefact ({exc.strerror})"
            ) from None
        except UnicodeDecodeError as exc:
            raise RankerArtefactError(
                f"{path}: not UTF-8 text (byte {exc.start}); not a ranker artefact"
            ) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RankerArtefactError(
                f"{path}: not JSON ({exc.msg} at line {exc.lineno})"
            ) from None
        except RecursionError:
            # An artefact is a few lists deep; a file nested beyond the parser's stack is not one.
            raise RankerArtefactError(
                f"{path}: JSON nested too deep for a ranker artefact"
            ) from None
        except ValueError as exc:  # e.g. an integer longer than Python converts
            raise RankerArtefactError(f"{path}: not usable JSON ({exc})") from None
        return cls.from_json(doc, str(path))


def _finite(value: Any) -> bool:
    """A number a float can hold: JSON's integers are unbounded, and one past the float range
    (a 400-digit integer) would raise in ``float()`` instead of being refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False
