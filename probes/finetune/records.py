"""A task's records in memory for fine-tuning: the probe's splits, locators, screening and preprocessing
(ecgpos.probes.shared.datasets.prepared_record), with every split row accounted for as the probe counts it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.probes.shared.datasets import missing_report, prepared_record, task_locator
from ecgpos.probes.shared.task_data import RecordKeys, TaskData, failed_line, record_column, task_data
from ecgpos.probes.shared.tasks import TaskDef, read_splits


def load_task(
    task: TaskDef,
    spec: PreprocessSpec,
    data_root: Path,
    splits_root: Path | None,
    cfg: RecordKeys,
    log: Callable[[str], None] = print,
    exclude: frozenset[str] | set[str] = frozenset(),
    copies: frozenset[str] | set[str] = frozenset(),
) -> TaskData:
    """TaskData whose `x[split]` is an object array of preprocessed (12, T) float32 records (T varies), for
    the records that are found, not excluded by the leakage guard, and pass the screening; the others are
    counted (not_found, overlap, split_copy, refused) and logged with their reasons."""
    tables = read_splits(task, splits_root, record_column(task, cfg))
    locator = task_locator(task, data_root)
    missing = {s: [k for k in t.records if locator.locate(k) is None] for s, t in tables.items()}
    for split, ids in missing.items():
        if ids:
            log(missing_report(task.name, split, ids, len(tables[split].records)))
    skip = {k for ids in missing.values() for k in ids} | set(exclude) | set(copies)
    signals: dict[str, np.ndarray] = {}
    failed: dict[str, str] = {}
    wanted = [k for t in tables.values() for k in t.records if k not in skip]
    for key in tqdm(dict.fromkeys(wanted), desc=f"{task.name} records", unit="rec", leave=False):
        try:
            signals[key] = prepared_record(*locator.locate(key), spec)
        except EcgposError as err:
            failed[key] = str(err)
    if failed:
        log(failed_line(task.name, failed))
    if not signals:
        raise EcgposError(f"{task.name}: none of its records could be read (e.g. {next(iter(failed.values()), '')})")

    def stack(rows: list) -> np.ndarray:
        out = np.empty(len(rows), dtype=object)  # records of different lengths
        out[:] = rows
        return out

    return task_data(task, tables, missing, failed, exclude, copies, signals, stack)
