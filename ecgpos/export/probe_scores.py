"""A probe folder's results.csv checked against its test_scores.npz.

`ecgpos probe` writes each seed's test macro-AUROC to results.csv and that seed's test logits, with
the test labels, to test_scores.npz. A row edited by hand, or a results.csv left from another run,
no longer matches the logits beside it; `probe --compare` and `export --probe-results` recompute the
macro-AUROC of every row whose logits are stored and refuse a folder where the two disagree.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ecgpos.errors import EcgposError

PROBE_SCORES_FILE = "test_scores.npz"
# results.csv holds the float written by the probe; reading it back may differ in the last bit or so
TOLERANCE = 1e-9


def macro_auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Macro-AUROC over the columns of labels (N, C) that hold both a positive and a negative, NaN when
    none does: what `ecgpos probe` reports as a seed's test_auroc (scikit-learn's roc_auc_score)."""
    from sklearn.metrics import roc_auc_score

    values = [
        float(roc_auc_score(labels[:, c], scores[:, c]))
        for c in range(labels.shape[1])
        if 0 < labels[:, c].sum() < len(labels)
    ]
    return float(np.mean(values)) if values else float("nan")


def _stored(folder: Path) -> dict[tuple[str, str, float, int], float]:
    """(encoder, task, fraction, seed) -> macro-AUROC recomputed from the folder's test_scores.npz."""
    path = folder / PROBE_SCORES_FILE
    out = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for i, entry in enumerate(json.loads(str(data["index"]))):
                labels, scores = data[f"labels_{entry['test']}"], data[f"scores_{i}"]
                for seed, seed_scores in zip(entry["seeds"], scores):
                    key = (str(entry["encoder"]), str(entry["task"]), float(entry["fraction"]), int(seed))
                    out[key] = macro_auroc(labels, seed_scores)
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
        raise EcgposError(f"{path}: not a readable probe test-score file ({type(err).__name__}: {err})") from None
    return out


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def check_probe_results(folder: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Refuse (EcgposError) when a results.csv row of `folder` disagrees with its stored test scores.

    rows: results.csv rows (encoder, task, fraction, seed, test_auroc; values as read, text or number).
    A row whose seed has no logits in test_scores.npz (or a folder without that file) is not checked."""
    folder = Path(folder)
    if not (folder / PROBE_SCORES_FILE).is_file():
        return
    stored = _stored(folder)
    for row in rows:
        try:
            key = (str(row["encoder"]), str(row["task"]), float(row["fraction"]), int(float(row["seed"])))
        except (KeyError, TypeError, ValueError):
            continue  # not a row of a probe run: nothing to match it to
        if key not in stored:
            continue
        written, recomputed = _number(row.get("test_auroc")), stored[key]
        if math.isnan(written) and math.isnan(recomputed):
            continue
        if not math.isclose(written, recomputed, rel_tol=0.0, abs_tol=TOLERANCE):
            encoder, task, fraction, seed = key
            raise EcgposError(
                f"{folder}: results.csv disagrees with {PROBE_SCORES_FILE} for task {task}, fraction "
                f"{fraction:g}, label {encoder!r}, seed {seed}: test_auroc {written!r} written, {recomputed!r} "
                "from the stored test scores (edited or stale results.csv; probe the folder again)"
            )
