"""The worker ranker at spawn: which predictor the sidecar uses, and what it is given.

``TENURE_WORKER_RANKER`` names a ranker artefact written by ``tenure train-ranker``
(:class:`~tenure.service.policy.ranker.RidgeRanker`); it is loaded once when the app is built, and a
file that does not load stops start-up with one line naming it. Without one the documented
heuristic (:class:`~tenure.service.policy.ranker.HeuristicRanker`: the median lifetime of the
sub-agent's type on the Claude Code trace) is used.

The prediction is made when a worker is spawned (``POST /v1/sessions/{parent}/workers``, or a
first request naming its parent): the spawn's own fields (``subagent_type``, ``model``,
``expected_tokens``, ``background``) plus what the sidecar knows of the parent, derived as the
replay derives it from a trace (:func:`tenure.service.policy.spawn_context.parent_features`): its
latest call (index, context after it, output size, reasoning, human turn, the gap before it),
the time since it started, the siblings spawned since that call, and its earlier workers
(count, returned, their geometric mean lifetime). A base artefact ignores the extended ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tenure.service.policy.ranker import (
    HeuristicRanker,
    RankerArtefactError,
    RidgeRanker,
    WorkerRanker,
)
from tenure.service.policy.ranker import SpawnRecord as SpawnRecord
from tenure.service.settings import SettingsError

__all__ = ["SpawnFacts", "load_ranker", "predict"]


def load_ranker(path: str) -> WorkerRanker:
    """The configured ranker; :class:`SettingsError` (one line, naming the file) if it fails."""
    if not path:
        return HeuristicRanker()
    try:
        return RidgeRanker.load(Path(path))
    except RankerArtefactError as exc:
        raise SettingsError(f"TENURE_WORKER_RANKER: {exc}") from None


@dataclass(frozen=True, slots=True)
class SpawnFacts:
    subagent_type: str = ""
    model: str = ""
    expected_tokens: int = 0
    background: bool = False
    parent_turn: int = 0
    parent_context_tokens: int = 0
    fanout: int = 1
    sibling_index: int = 0
    session_elapsed_s: float = 0.0
    # The extended set (tenure.service.policy.ranker.EXTENDED_FEATURES), filled by the tracker.
    parent_output_tokens: int = 0
    parent_thinking: bool = False
    parent_human_turn: bool = False
    parent_gap_s: float = 0.0
    workers_before: int = 0
    workers_returned: int = 0
    returned_mean_lifetime_s: float = 0.0


def predict(ranker: WorkerRanker, facts: SpawnFacts) -> float:
    """Predicted lifetime (seconds) of a worker spawned with ``facts``."""
    record = SpawnRecord(
        subagent_type=facts.subagent_type,
        model=facts.model,
        context_tokens=facts.expected_tokens,
        background=facts.background,
        parent_turn=facts.parent_turn,
        parent_context_tokens=facts.parent_context_tokens,
        fanout=facts.fanout,
        sibling_index=facts.sibling_index,
        session_elapsed_s=facts.session_elapsed_s,
        parent_output_tokens=facts.parent_output_tokens,
        parent_thinking=facts.parent_thinking,
        parent_human_turn=facts.parent_human_turn,
        parent_gap_s=facts.parent_gap_s,
        workers_before=facts.workers_before,
        workers_returned=facts.workers_returned,
        returned_mean_lifetime_s=facts.returned_mean_lifetime_s,
    )
    value = float(ranker.predict_lifetime_s(record))
    return value if value >= 0 and value == value and value != float("inf") else 0.0
