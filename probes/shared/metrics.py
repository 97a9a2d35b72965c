"""AUROC: a vectorised rank formula for per-epoch selection (ecgpos.metrics), scikit-learn for reported test numbers."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.metrics import roc_auc_score

from ecgpos.metrics import auroc_columns

__all__ = ["auroc_columns", "macro_auroc_sklearn"]


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
