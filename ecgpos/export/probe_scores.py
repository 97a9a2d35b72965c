"""A probe folder's stored test scores (test_scores.npz), their macro-AUROC, and results.csv checked against them.

`ecgpos probe` writes each seed's test macro-AUROC to results.csv and that seed's test logits, with
the test record keys, labels and patients, to test_scores.npz (`save_scores`; `load_scores` reads them back for
`probe --compare`). A row edited by hand, or a results.csv left from another run, no longer matches
the logits beside it; `probe --compare` and `export --probe-results` recompute the macro-AUROC of
every row whose logits are stored and refuse a folder where the two disagree.
"""

from __future__ import annotations

import csv
import json
import math
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ecgpos.errors import EcgposError
from ecgpos.files import atomic_path
from ecgpos.metrics import auroc_columns

PROBE_SCORES_FILE = "test_scores.npz"
# results.csv holds the float written by the probe; reading it back may differ in the last bit or so
TOLERANCE = 1e-9


@dataclass
class ScoreSet:
    """Test logits of every seed of one (encoder, task, fraction) and the test records they score."""

    encoder: str
    task: str
    fraction: float
    seeds: list[int]
    keys: list[str]
    labels: np.ndarray  # (N, C) 0/1
    scores: np.ndarray  # (S, N, C) float32
    patients: list[str] | None = None  # (N,) the patient of each test record, where the split files name one


def save_scores(sets: Sequence[ScoreSet], out: Path) -> None:
    """OUT/test_scores.npz: an index (JSON) plus, per set, the logits, and per distinct test set (keys
    and labels) its keys and labels. Sets of one task may differ in their test records (a merged folder,
    or a record one encoder could not embed), so test sets are shared by content, never by task."""
    arrays, index, tests = {}, [], {}
    for i, s in enumerate(sets):
        arrays[f"scores_{i}"] = s.scores.astype(np.float32)
        labels = np.asarray(s.labels)
        patients = None if s.patients is None else tuple(map(str, s.patients))
        test = (s.task, tuple(s.keys), labels.shape, labels.tobytes(), patients)
        if test not in tests:
            tests[test] = len(tests)
            arrays[f"keys_{tests[test]}"] = np.array(s.keys, dtype=str)
            arrays[f"labels_{tests[test]}"] = labels
            if patients is not None:
                arrays[f"patients_{tests[test]}"] = np.array(patients, dtype=str)
        index.append(
            {"encoder": s.encoder, "task": s.task, "fraction": s.fraction, "seeds": s.seeds, "test": tests[test]}
        )
    with atomic_path(Path(out) / PROBE_SCORES_FILE, suffix=".npz") as tmp:
        np.savez_compressed(tmp, index=np.array(json.dumps(index)), **arrays)


def load_scores(folder: str | Path, renames: dict[str, str] | None = None) -> list[ScoreSet]:
    """The ScoreSets of a probe folder (none when it has no test_scores.npz); encoders renamed as merged.
    A file that cannot be read as one is refused (EcgposError)."""
    path = Path(folder) / PROBE_SCORES_FILE
    if not path.is_file():
        return []
    try:
        with np.load(path, allow_pickle=False) as data:
            index = json.loads(str(data["index"]))
            sets = [
                ScoreSet(
                    (renames or {}).get(e["encoder"], e["encoder"]),
                    e["task"],
                    float(e["fraction"]),
                    e["seeds"],
                    data[f"keys_{e['test']}"].tolist(),
                    data[f"labels_{e['test']}"],
                    data[f"scores_{i}"],
                    data[f"patients_{e['test']}"].tolist() if f"patients_{e['test']}" in data.files else None,
                )
                for i, e in enumerate(index)
            ]
            for found in sets:
                _check_set(path, found)
            return sets
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
        raise _unreadable(path, err) from None


AUROC_COLUMNS = (
    "val_auroc",
    "test_auroc",
    "test_auroc_low",
    "test_auroc_high",
    "mean_auroc_low",
    "mean_auroc_high",
    "macro_auroc",
)


def read_result_rows(path: str | Path) -> list[dict[str, str]]:
    """The rows of a probe folder's results.csv, each checked (EcgposError naming the file and line):
    as many fields as the header (a truncated copy has fewer), a whole seed, a fraction in (0, 1], and
    every AUROC finite and in [0, 1]. An empty AUROC (or NaN) is kept only in a row whose `note` says why
    (the probe writes one when a split had no rows): otherwise a mean and its interval would be taken
    over numbers no probe can produce."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if not header:
                raise EcgposError(f"{path}: cannot read CSV (the file is empty): not a probe results file")
            rows = []
            for fields in reader:
                if not fields:
                    continue
                if len(fields) != len(header):
                    raise EcgposError(
                        f"{path} line {reader.line_num}: {len(fields)} fields where the header has {len(header)} "
                        "(a truncated or hand-edited copy?)"
                    )
                row = dict(zip(header, fields))
                _check_row(path, reader.line_num, row)
                rows.append(row)
    except (UnicodeDecodeError, csv.Error) as err:
        raise EcgposError(f"{path}: cannot read CSV ({type(err).__name__}: {str(err).splitlines()[0]})") from None
    return rows


def _check_row(path: Path, line: int, row: Mapping[str, str]) -> None:
    where = f"{path} line {line}"
    if "seed" in row:
        seed = _number(row["seed"])
        if not (math.isfinite(seed) and seed >= 0 and seed == int(seed)):
            raise EcgposError(f"{where}: seed {row['seed']!r} is not a whole number")
    if "fraction" in row:
        fraction = _number(row["fraction"])
        if not 0 < fraction <= 1:
            raise EcgposError(f"{where}: fraction {row['fraction']!r} is not a share of the labels in (0, 1]")
    explained = bool(str(row.get("note", "")).strip())
    for column in [c for c in AUROC_COLUMNS if c in row]:
        text = str(row[column]).strip()
        value = _number(text)
        if (not text or math.isnan(value)) and (explained or column != "test_auroc" and column != "macro_auroc"):
            continue  # no number, and the row says why (or an optional column: no bootstrap, no val)
        if not 0 <= value <= 1:
            raise EcgposError(f"{where}: {column} {text!r} is not an AUROC (a finite number in [0, 1])")


def _unreadable(path: Path, err: Exception) -> EcgposError:
    return EcgposError(f"{path}: not a readable probe test-score file ({type(err).__name__}: {err})")


def _check_set(path: Path, found: ScoreSet) -> None:
    """One line unless a set's logits are finite, one (N, C) per seed its index names, over 0/1 labels of its N keys."""
    what = f"{path}: {found.encoder}, {found.task}, fraction {found.fraction:g}"
    scores, labels = np.asarray(found.scores), np.asarray(found.labels)
    if not isinstance(found.seeds, list) or not all(isinstance(x, int) and x >= 0 for x in found.seeds):
        raise EcgposError(f"{what}: seeds {found.seeds!r} are not whole numbers")
    if scores.ndim != 3 or scores.shape[0] != len(found.seeds):
        raise EcgposError(f"{what}: logits of shape {scores.shape} for the {len(found.seeds)} seeds its index names")
    if labels.shape != scores.shape[1:] or len(found.keys) != labels.shape[0]:
        raise EcgposError(f"{what}: {len(found.keys)} keys and labels {labels.shape} for logits {scores.shape}")
    if not np.isfinite(scores).all():
        raise EcgposError(f"{what}: logits hold NaN or inf")
    if not np.isin(labels, (0, 1)).all():
        raise EcgposError(f"{what}: labels other than 0 and 1")


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
    out = {}
    try:
        for s in load_scores(folder):
            for seed, macro in zip(s.seeds, macro_aurocs(s.labels, s.scores)):
                out[(str(s.encoder), str(s.task), s.fraction, int(seed))] = float(macro)
    except (ValueError, TypeError) as err:  # readable, but not numbers where numbers belong
        raise _unreadable(folder / PROBE_SCORES_FILE, err) from None
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
