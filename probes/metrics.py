"""AUROC: a vectorised rank formula for per-epoch selection, scikit-learn for reported test numbers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.stats import rankdata
from sklearn.metrics import roc_auc_score


def auroc_columns(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """AUROC of every column at once: scores, labels (N, K) -> (K,), NaN where a column lacks a class.

    Mann-Whitney form with average ranks for ties: AUROC = (R_pos - P(P+1)/2) / (P * Q), which is
    exactly the area under the trapezoidal ROC curve that sklearn's roc_auc_score computes. Ranks
    come from one sort per column; only columns that contain tied scores (rare for real-valued
    outputs) are re-ranked with scipy's tie-averaging rankdata.
    """
    s = np.ascontiguousarray(np.asarray(scores).T)  # (K, N): sort along contiguous rows
    y = np.ascontiguousarray(np.asarray(labels).T).astype(bool)
    order = np.argsort(s, axis=1)
    ordered = np.take_along_axis(s, order, axis=1)
    rank_sum = (np.take_along_axis(y, order, axis=1) * np.arange(1, s.shape[1] + 1)).sum(axis=1).astype(np.float64)
    for k in np.flatnonzero((np.diff(ordered, axis=1) == 0).any(axis=1)):
        rank_sum[k] = rankdata(s[k])[y[k]].sum()
    pos = y.sum(axis=1).astype(np.float64)
    neg = s.shape[1] - pos
    with np.errstate(divide="ignore", invalid="ignore"):
        auc = (rank_sum - pos * (pos + 1) / 2) / (pos * neg)
    return np.where((pos > 0) & (neg > 0), auc, np.nan)


def macro_auroc_sklearn(
    labels: np.ndarray, scores: np.ndarray, class_names: Sequence[str]
) -> tuple[float, dict[str, float]]:
    """Macro-AUROC over the classes that have both a positive and a negative in `labels` (N, C).

    Returns (macro, {class: AUROC}); left-out classes are absent from the dict and the macro is NaN
    when no class can be scored.
    """
    per_class = {}
    for c, name in enumerate(class_names):
        y = labels[:, c]
        if 0 < y.sum() < len(y):
            per_class[name] = float(roc_auc_score(y, scores[:, c]))
    macro = float(np.mean(list(per_class.values()))) if per_class else float("nan")
    return macro, per_class
