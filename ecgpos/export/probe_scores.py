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
from ecgpos.metrics import auroc_columns

PROBE_SCORES_FILE = "test_scores.npz"
# results.csv holds the float written by the probe; reading it back may differ in the last bit or so
TOLERANCE = 1e-9


def macro_aurocs(labels: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Each seed's macro-AUROC: labels (N, C) 0/1, scores (S, N, C) -> (S,), over the classes that have
    both a positive and a negative (NaN when none has). This is the test_auroc `ecgpos probe` reports
    (scikit-learn's roc_auc_score per class), by the rank formula: equal to float rounding, and one
    sort for all seeds and classes instead of one scikit-learn call per class."""
    labels = np.asarray(labels)
    seeds, n, _ = scores.shape
    valid = (labels.sum(axis=0) > 0) & (labels.sum(axis=0) < n)
    if not valid.any():
        return np.full(seeds, np.nan)
    flat = np.moveaxis(scores[:, :, valid], 0, 1).reshape(n, -1)  # (N, S * valid classes), seed-major
    per_class = auroc_columns(flat, np.tile(labels[:, valid], (1, seeds))).reshape(seeds, -1)
    return per_class.mean(axis=1)


def _stored(folder: Path) -> dict[tuple[str, str, float, int], float]:
    """(encoder, task, fraction, seed) -> macro-AUROC recomputed from the folder's test_scores.npz."""
    path = folder / PROBE_SCORES_FILE
    out = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for i, entry in enumerate(json.loads(str(data["index"]))):
                labels, scores = data[f"labels_{entry['test']}"], data[f"scores_{i}"]
                if scores.ndim != 3 or labels.shape != scores.shape[1:]:
                    continue  # an older writer paired these logits with another set's labels: not checkable
                macros = macro_aurocs(labels, scores)
                for seed, macro in zip(entry["seeds"], macros):
                    key = (str(entry["encoder"]), str(entry["task"]), float(entry["fraction"]), int(seed))
                    out[key] = float(macro)
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
