"""A task's rows as every protocol reads them: the record settings (which PTB-XL files, how many windows per
record), MERL's label-fraction subsets, and `TaskData`, each split row kept or counted with the reason it
was left out.

`ecgpos probe` (ProbeConfig) and `ecgpos finetune` (FinetuneConfig) carry the keys of `RecordSettings`
with its defaults; `ecgpos geometry` reads records with the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from sklearn.model_selection import train_test_split

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.tasks import TaskDef


@dataclass(frozen=True)
class RecordSettings:
    """How a task's records are read; the defaults of the probe and fine-tuning configs."""

    ptbxl_records: str = "records500"  # or records100 (reads filename_lr)
    # windows of spec.window samples embedded per record and averaged (spread evenly, at least half a
    # window apart; a record shorter than one window is zero-padded at the end). CPSC records are
    # 6-60 s (up to 6 windows at 250 Hz), PTB-XL records are 10 s (one centred 9 s window).
    windows_ptbxl: int = 1
    windows_cpsc2018: int = 4
    windows_csn: int = 1  # ecg-arrhythmia records are 10 s
    windows_custom: int = 1


class RecordKeys(Protocol):
    """Any settings with RecordSettings' keys: RecordSettings, ProbeConfig, FinetuneConfig."""

    ptbxl_records: str
    windows_ptbxl: int
    windows_cpsc2018: int
    windows_csn: int
    windows_custom: int


@dataclass
class TaskData:
    """Features and labels of one task for one source, with what was left out and why."""

    task: TaskDef
    x: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    train_positions: np.ndarray  # row of each kept train sample in the full train CSV
    n_full_train: int
    missing: dict[str, list[str]]
    failed: dict[str, str]
    keys: dict[str, list[str]] = field(default_factory=dict)  # record key of every kept row, per split
    # split -> RECORD_COUNTS: every row of the split file is in exactly one of the last five
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    patients: dict[str, list[str]] = field(default_factory=dict)  # patient of every kept row, where named


# what became of a split file's rows: listed = not_found + refused + overlap + split_copy + probed
# (overlap: matches a pretraining record; split_copy: a val or test copy of an earlier split's record)
RECORD_COUNTS = ("listed", "not_found", "refused", "overlap", "split_copy", "probed")
WINDOW_DATASETS = ("ptbxl", "cpsc2018", "csn", "custom")  # RecordSettings.windows_<dataset>


def failed_line(task_name: str, failed: dict[str, str]) -> str:
    """The log line naming (the first five of) a task's records that failed to read."""
    ids = sorted(failed)
    head = "; ".join(f"{k} ({failed[k]})" for k in ids[:5])
    return f"{task_name}: {len(ids)} records failed to read and are excluded: {head}{' ...' if len(ids) > 5 else ''}"


def task_data(
    task: TaskDef,
    tables: dict,
    missing: dict[str, list[str]],
    failed: dict[str, str],
    exclude: frozenset[str] | set[str],
    copies: frozenset[str] | set[str],
    values: dict[str, object],
    stack: Callable[[list], np.ndarray],
) -> TaskData:
    """TaskData of the rows whose record has a value (`values`: record key -> features or signal), stacked
    per split by `stack`; every split row counted in exactly one of RECORD_COUNTS."""
    x, y, keys, counts, patients, positions = {}, {}, {}, {}, {}, np.zeros(0, int)
    for split, table in tables.items():
        keep = np.array([k in values for k in table.records], dtype=bool)
        keys[split] = [k for k, ok in zip(table.records, keep) if ok]
        if table.patients is not None:
            patients[split] = [p for p, ok in zip(table.patients, keep) if ok]
        not_found = set(missing[split])
        counts[split] = {
            "listed": len(table.records),
            "not_found": len(missing[split]),  # rows, not ids: blank record cells are each a row
            "refused": sum(k in failed for k in table.records),
            "overlap": sum(k in exclude and k not in not_found for k in table.records),
            "split_copy": sum(k in copies and k not in exclude and k not in not_found for k in table.records),
            "probed": int(keep.sum()),
        }
        x[split] = stack([values[k] for k in keys[split]])
        y[split] = table.labels[keep]
        if split == "train":
            positions = np.flatnonzero(keep)
    return TaskData(task, x, y, positions, len(tables["train"].records), missing, failed, keys, counts, patients)


# More than any protocol uses (default 5): per-epoch curves of every seed are held in memory, so far
# larger counts failed in numpy (or never finished) after the features were extracted.
MAX_SEEDS = 1_000


def check_record_settings(cfg: RecordKeys, fractions: Sequence[float], seeds: int) -> None:
    """One EcgposError line for record settings, fractions and seeds that would crash later or be silently
    replaced (0 windows are embedded as 1) while recorded as given."""
    if seeds < 1:
        raise EcgposError(f"seeds={seeds}: must be at least 1")
    if seeds > MAX_SEEDS:
        raise EcgposError(f"seeds={seeds}: at most {MAX_SEEDS} seeds")
    # a fraction above 1 would train on all labels under a "1000%" heading (percent given where the
    # config takes fractions), 0 on none; a repeated one would train the same probes twice
    values = [float(f) for f in fractions]
    if not values or any(not 0 < f <= 1 for f in values) or len(set(values)) < len(values):
        raise EcgposError(
            f"fractions={values}: label fractions must be distinct numbers in (0, 1], "
            "e.g. [0.01, 0.1, 1] (--fractions takes percentages: 1,10,100)"
        )
    bad = [f"windows_{d}={getattr(cfg, f'windows_{d}')}" for d in WINDOW_DATASETS if getattr(cfg, f"windows_{d}") < 1]
    if bad:
        raise EcgposError(f"{', '.join(bad)}: must be at least 1")


def task_windows(cfg: RecordKeys, dataset: str) -> int:
    return {"ptbxl": cfg.windows_ptbxl, "cpsc2018": cfg.windows_cpsc2018, "csn": cfg.windows_csn}.get(
        dataset, cfg.windows_custom
    )


def dataset_key(task: TaskDef, data_root: Path, cfg: RecordKeys) -> str:
    if task.dataset == "custom":
        return f"custom:{Path(task.files['train']).parent}"
    extra = f"/{cfg.ptbxl_records}" if task.dataset == "ptbxl" else ""
    return f"{task.dataset}:{data_root.resolve()}{extra}"


def record_column(task: TaskDef, cfg: RecordKeys) -> str | None:
    if task.dataset == "ptbxl":
        if cfg.ptbxl_records not in ("records500", "records100"):
            raise EcgposError(f"ptbxl_records must be records500 or records100, got {cfg.ptbxl_records!r}")
        return "filename_lr" if cfg.ptbxl_records == "records100" else "filename_hr"
    return None


def label_fraction_rows(n_rows: int, fraction: float) -> np.ndarray:
    """Row indices of a training subset, drawn as MERL does.

    fraction < 1: `train_test_split(arange(n_rows), train_size=fraction, random_state=42)[0]`
    (same subset for every seed, in sklearn's order); fraction >= 1: all rows; none when the
    fraction of n_rows is less than one row.
    """
    rows = np.arange(n_rows)
    if fraction >= 1.0:
        return rows
    if int(fraction * n_rows) == 0:  # sklearn refuses an empty subset; the probe reports "no train rows"
        return rows[:0]
    subset, _ = train_test_split(rows, train_size=fraction, random_state=42)
    return np.asarray(subset)


def fraction_rows(data: TaskData, fraction: float) -> np.ndarray:
    """Rows of data.x['train'] in the label-fraction subset: MERL's subset of the full train CSV,
    restricted to the records present (in the subset's order)."""
    subset = label_fraction_rows(data.n_full_train, fraction)
    where = {int(p): i for i, p in enumerate(data.train_positions)}
    return np.array([where[int(p)] for p in subset if int(p) in where], dtype=int)


def sort_rows(rows: Sequence[dict], sources: Sequence[str], tasks: Sequence[str]) -> list[dict]:
    """results.csv order: source, task (as asked), fraction, seed."""
    return sorted(
        rows, key=lambda r: (list(sources).index(r["encoder"]), list(tasks).index(r["task"]), r["fraction"], r["seed"])
    )
