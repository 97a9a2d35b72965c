"""AUROC of many columns at once, by the rank formula: the probes' per-epoch selection, and the check of a
probe folder's results.csv against its stored test scores (ecgpos.export.probe_scores)."""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


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
