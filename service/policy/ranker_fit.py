"""Training and evaluating the worker ranker: ridge regression, session-grouped k-fold CV.

The evaluation the seed uses (section 3.5): out-of-fold predictions from a k-fold split that
keeps every sub-agent of one session in the same fold (a model never sees the session it is
scored on), scored by Kendall's tau-b between predicted and recorded lifetimes. The ridge
penalty is chosen inside each training fold (nested, grouped leave-one-session-out over a fixed
grid), never on the fold being scored. Heuristics are scored the same way: ``type`` (the
training folds' mean log lifetime per sub-agent type), ``size`` (bigger starting context =
longer), ``sibling-order`` (later in a fan-out = longer) and ``spawn-order`` (a constant: every
pair tied, tau 0). Deterministic: folds come from the sorted session ids.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tenure.service.policy.ranker import (
    CATEGORICAL_FEATURES,
    EXTENDED_FEATURES,
    NUMERIC_FEATURES,
    RidgeRanker,
    SpawnRecord,
    feature_vector,
)

__all__ = [
    "ALPHAS",
    "LabeledSpawn",
    "cross_validate",
    "fit_pairwise",
    "fit_ridge",
    "grouped_folds",
    "kendall_tau",
]

ALPHAS = (0.1, 1.0, 10.0, 100.0)


@dataclass(frozen=True, slots=True)
class LabeledSpawn:
    """A spawn record with its session (the CV group) and its recorded lifetime."""

    session: str
    worker: str
    record: SpawnRecord
    lifetime_s: float


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float:
    """Kendall's tau-b (ties in either ranking handled); ``nan`` when undefined."""
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.size != y.size:
        raise ValueError("kendall_tau needs two sequences of one length")
    if x.size < 2:
        return math.nan
    dx = np.sign(x[:, None] - x[None, :])
    dy = np.sign(y[:, None] - y[None, :])
    iu = np.triu_indices(x.size, 1)
    sx, sy = dx[iu], dy[iu]
    concordance = float(np.sum(sx * sy))
    nx, ny = float(np.sum(sx != 0)), float(np.sum(sy != 0))
    if nx == 0 or ny == 0:
        return math.nan
    return concordance / math.sqrt(nx * ny)


def within_session_pairs(sessions: Sequence[str], predicted: Sequence[float]) -> int:
    """Same-session pairs the predictions order (not tied): what the within-session tau uses."""
    groups: dict[str, list[float]] = {}
    for s, p in zip(sessions, predicted, strict=True):
        groups.setdefault(s, []).append(p)
    return sum(1 for vs in groups.values() for i, a in enumerate(vs) for b in vs[i + 1 :] if a != b)


def within_session_tau(
    sessions: Sequence[str], predicted: Sequence[float], actual: Sequence[float]
) -> float:
    """Tau-b over pairs of workers of the same session only (what the predictive path ranks)."""
    conc = 0.0
    nx = ny = 0.0
    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sessions):
        groups.setdefault(s, []).append(i)
    for idx in groups.values():
        for i_pos, i in enumerate(idx):
            for j in idx[i_pos + 1 :]:
                sp = np.sign(predicted[i] - predicted[j])
                sa = np.sign(actual[i] - actual[j])
                conc += float(sp * sa)
                nx += float(sp != 0)
                ny += float(sa != 0)
    if nx == 0 or ny == 0:
        return math.nan
    return conc / math.sqrt(nx * ny)


def grouped_folds(sessions: Sequence[str], k: int) -> list[list[int]]:
    """Indices per fold; whole sessions per fold, sessions dealt round-robin in sorted order.

    Sessions are dealt largest-first (ties by id) so folds hold similar worker counts.
    """
    counts: dict[str, int] = {}
    for s in sessions:
        counts[s] = counts.get(s, 0) + 1
    order = sorted(counts, key=lambda s: (-counts[s], s))
    n_folds = max(1, min(k, len(order)))
    fold_of = {s: i % n_folds for i, s in enumerate(order)}
    folds: list[list[int]] = [[] for _ in range(n_folds)]
    for i, s in enumerate(sessions):
        folds[fold_of[s]].append(i)
    return folds


def _vocab(records: Sequence[SpawnRecord]) -> dict[str, list[str]]:
    vocab: dict[str, list[str]] = {}
    for name in CATEGORICAL_FEATURES:
        values = sorted({r.categories()[name] for r in records} - {""})
        vocab[name] = values
    return vocab


def _design(
    data: Sequence[LabeledSpawn], numeric: Sequence[str]
) -> tuple[dict[str, list[str]], np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Vocabulary, standardised design matrix, its mean and its scale."""
    records = [d.record for d in data]
    vocab = _vocab(records)
    x = np.array([feature_vector(r, vocab, numeric) for r in records], dtype=float)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale <= 1e-12] = 1.0
    return vocab, (x - mean) / scale, mean, scale


def fit_ridge(
    data: Sequence[LabeledSpawn],
    alpha: float,
    meta: dict[str, Any] | None = None,
    numeric: Sequence[str] = NUMERIC_FEATURES,
) -> RidgeRanker:
    """Ridge on standardised features (intercept unpenalised) for ``log`` lifetime."""
    if not data:
        raise ValueError("no labelled spawns to train on")
    records = [d.record for d in data]
    vocab = _vocab(records)
    x = np.array([feature_vector(r, vocab, numeric) for r in records], dtype=float)
    y = np.log(np.maximum([d.lifetime_s for d in data], 1e-3))
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale <= 1e-12] = 1.0
    z = (x - mean) / scale
    intercept = float(y.mean())
    gram = z.T @ z + alpha * np.eye(z.shape[1])
    weights = np.linalg.solve(gram, z.T @ (y - intercept))
    return RidgeRanker(
        vocab, mean.tolist(), scale.tolist(), weights.tolist(), intercept, alpha, meta, numeric
    )


def fit_pairwise(
    data: Sequence[LabeledSpawn], alpha: float, numeric: Sequence[str] = EXTENDED_FEATURES
) -> RidgeRanker:
    """A pairwise (RankNet-style) linear ranker: L2-penalised logistic regression on the
    feature differences of same-session pairs, learning the order only (what the predictive
    path needs). Returned as a :class:`RidgeRanker` whose score is an order, not a lifetime
    (its intercept is the mean log lifetime, so it stays in the same units roughly)."""
    if not data:
        raise ValueError("no labelled spawns to train on")
    vocab, z, mean, scale = _design(data, numeric)
    y = np.log(np.maximum([d.lifetime_s for d in data], 1e-3))
    diffs: list[np.ndarray[Any, Any]] = []
    wins: list[float] = []
    for i in range(len(data)):
        for j in range(i + 1, len(data)):
            if data[i].session == data[j].session and y[i] != y[j]:
                diffs.append(z[i] - z[j])
                wins.append(1.0 if y[i] > y[j] else 0.0)
    w = np.zeros(z.shape[1])
    if diffs:
        d = np.array(diffs)
        t = np.array(wins)
        for _ in range(50):  # Newton steps on a strictly convex loss
            p = 1.0 / (1.0 + np.exp(-(d @ w)))
            grad = d.T @ (p - t) + alpha * w
            hess = (d * (p * (1 - p))[:, None]).T @ d + alpha * np.eye(w.size)
            step = np.linalg.solve(hess, grad)
            w -= step
            if float(np.max(np.abs(step))) < 1e-9:
                break
    return RidgeRanker(
        vocab, mean.tolist(), scale.tolist(), w.tolist(), float(y.mean()), alpha, None, numeric
    )


def _choose_alpha(
    train: Sequence[LabeledSpawn],
    fit: Callable[[Sequence[LabeledSpawn], float], RidgeRanker] | None = None,
) -> float:
    """The grid penalty with the best leave-one-session-out tau inside ``train``."""
    sessions = [d.session for d in train]
    if len(set(sessions)) < 3:
        return ALPHAS[-1]
    best, best_tau = ALPHAS[-1], -math.inf
    for alpha in ALPHAS:

        def trainer(tr: Sequence[LabeledSpawn], a: float = alpha) -> RidgeRanker:
            return fit_ridge(tr, a) if fit is None else fit(tr, a)

        preds = _out_of_fold(train, trainer, len(set(sessions)))
        tau = kendall_tau(preds, [d.lifetime_s for d in train])
        if not math.isnan(tau) and tau > best_tau + 1e-12:
            best, best_tau = alpha, tau
    return best


Predictor = Callable[[SpawnRecord], float]


def _out_of_fold(
    data: Sequence[LabeledSpawn],
    train: Callable[[Sequence[LabeledSpawn]], Any],
    k: int,
) -> list[float]:
    preds = [math.nan] * len(data)
    for fold in grouped_folds([d.session for d in data], k):
        held = set(fold)
        model = train([d for i, d in enumerate(data) if i not in held])
        for i in fold:
            preds[i] = float(_predict(model, data[i].record))
    return preds


def _predict(model: Any, record: SpawnRecord) -> float:
    if isinstance(model, RidgeRanker):
        return model.predict_log(record)
    return float(model(record))


class _TypeMean:
    def __init__(self, train: Sequence[LabeledSpawn]) -> None:
        logs: dict[str, list[float]] = {}
        for d in train:
            logs.setdefault(d.record.subagent_type, []).append(math.log(max(d.lifetime_s, 1e-3)))
        all_logs = [v for vs in logs.values() for v in vs]
        self.default = sum(all_logs) / len(all_logs) if all_logs else 0.0
        self.means = {k: sum(v) / len(v) for k, v in logs.items()}

    def __call__(self, record: SpawnRecord) -> float:
        return self.means.get(record.subagent_type, self.default)


HEURISTICS: dict[str, Callable[[Sequence[LabeledSpawn]], Predictor]] = {
    "type": _TypeMean,
    "size": lambda _train: lambda r: float(r.context_tokens),
    "sibling-order": lambda _train: lambda r: float(r.sibling_index),
    "workers-before": lambda _train: lambda r: float(r.workers_before),
    "spawn-order": lambda _train: lambda _r: 0.0,
}


def cross_validate(data: Sequence[LabeledSpawn], k: int = 5) -> dict[str, Any]:
    """Out-of-fold predictions and Kendall tau for the ridge ranker and every heuristic."""
    if len(data) < 2:
        raise ValueError(f"need at least 2 labelled spawns to evaluate, got {len(data)}")
    actual = [d.lifetime_s for d in data]
    sessions = [d.session for d in data]
    folds = grouped_folds(sessions, k)
    alphas: list[float] = []

    def train_ridge(train: Sequence[LabeledSpawn]) -> RidgeRanker:
        alpha = _choose_alpha(train)
        alphas.append(alpha)
        return fit_ridge(train, alpha)

    def extended(tr: Sequence[LabeledSpawn], a: float) -> RidgeRanker:
        return fit_ridge(tr, a, numeric=EXTENDED_FEATURES)

    def train_extended(train: Sequence[LabeledSpawn]) -> RidgeRanker:
        return extended(train, _choose_alpha(train, extended))

    def train_pairwise(train: Sequence[LabeledSpawn]) -> RidgeRanker:
        return fit_pairwise(train, _choose_alpha(train, fit_pairwise))

    out: dict[str, Any] = {
        "folds": len(folds),
        "workers": len(data),
        "sessions": len(set(sessions)),
        "rankers": {},
    }
    predictors: dict[str, Callable[[Sequence[LabeledSpawn]], Any]] = {
        "ridge": train_ridge,
        "ridge-extended": train_extended,
        "pairwise-extended": train_pairwise,
        **HEURISTICS,
    }
    oof: dict[str, list[float]] = {}
    for name, trainer in predictors.items():
        preds = _out_of_fold(data, trainer, k)
        oof[name] = preds
        per_fold = [
            kendall_tau([preds[i] for i in fold], [actual[i] for i in fold]) for fold in folds
        ]
        finite = [t for t in per_fold if not math.isnan(t)]
        out["rankers"][name] = {
            "kendall_tau": kendall_tau(preds, actual),
            "kendall_tau_within_session": within_session_tau(sessions, preds, actual),
            "within_session_pairs_ordered": within_session_pairs(sessions, preds),
            "kendall_tau_fold_mean": sum(finite) / len(finite) if finite else math.nan,
            "kendall_tau_folds": per_fold,
        }
    out["ridge_alphas"] = alphas
    out["oof_predictions"] = {
        d.worker: {
            "ridge_log_lifetime": oof["ridge"][i],
            "ridge_extended_log_lifetime": oof["ridge-extended"][i],
            "lifetime_s": d.lifetime_s,
        }
        for i, d in enumerate(data)
    }
    return out
