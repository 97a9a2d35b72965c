"""Probe tasks as data: which split files, which record column, which class columns.

The five paper tasks and MERL's Chapman-Shaoxing-Ningbo task (`csn`, 38 classes, guarded against
pretraining leakage) use MERL's split files (`--splits DIR`). A `custom:<dir>` task is any folder
holding train.csv, val.csv and test.csv with a `record` column (a WFDB record path, relative to
that folder or absolute) and, after it, one 0/1 column per class (the same columns in all three);
the demo uses it on synthetic records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ecgpos.errors import EcgposError

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class TaskDef:
    """Where a task's splits live and how to read them.

    dataset: 'ptbxl' | 'cpsc2018' | 'csn' | 'custom' (decides how a record column value becomes a signal).
    files: split name -> CSV path relative to the splits root (or absolute for custom tasks).
    record_column: the column naming the record (PTB-XL: filename_hr, swapped for filename_lr at 100 Hz).
    """

    name: str
    dataset: str
    files: dict[str, str]
    record_column: str
    classes: tuple[str, ...]
    label: str  # column title in tables
    meta: tuple[str, ...] = ()  # the non-class columns; any other column that is not a class is a mismatch


def _ptbxl(name: str, folder: str, label: str, classes: str) -> TaskDef:
    files = {s: f"ptbxl/{folder}/ptbxl_{folder}_{s}.csv" for s in SPLITS}
    meta = ("ecg_id", "patient_id", "strat_fold", "filename_lr", "filename_hr", folder)
    return TaskDef(name, "ptbxl", files, "filename_hr", tuple(classes.split()), label, meta)


TASKS: dict[str, TaskDef] = {
    t.name: t
    for t in (
        _ptbxl("ptbxl-super", "super_class", "Super", "HYP NORM MI CD STTC"),
        _ptbxl(
            "ptbxl-sub",
            "sub_class",
            "Sub",
            "AMI LAFB/LPFB LVH STTC IMI SEHYP CRBBB WPW LAO/LAE NORM AVB RAO/RAE ISC LMI ISCI ISCA NST CLBBB "
            "ILBBB IRBBB PMI RVH IVCD",
        ),
        _ptbxl(
            "ptbxl-form",
            "form",
            "Form",
            "PAC DIG HVOLT STD LPR QWAVE VCLVH NDT TAB LOWT ABQRS LNGQT PRC(S) NT STE NST PVC INVT LVOLT",
        ),
        _ptbxl("ptbxl-rhythm", "rhythm", "Rhythm", "SVARR BIGU STACH SARRH SBRAD TRIGU AFIB SR SVTAC PSVT AFLT PACE"),
        TaskDef(
            "cpsc2018",
            "cpsc2018",
            {s: f"icbeb/icbeb_{s}.csv" for s in SPLITS},
            "filename",
            ("AFIB", "VPC", "NORM", "1AVB", "CRBBB", "STE", "PAC", "CLBBB", "STD"),
            "CPSC2018",
            ("patient_id", "ecg_id", "filename", "validation", "age", "sex", "scp_codes"),
        ),
    )
}
PAPER_TASKS = tuple(TASKS)

# MERL's third downstream set, Chapman-Shaoxing-Ningbo: records of the ecg-arrhythmia database (which the
# paper pretrains on), so it runs only with the pretraining-leakage guard. `ecg_path` is
# /chapman/WFDBRecords/NN/NNN/JSxxxxx.mat; the class columns are MERL's, in their file order.
CSN_CLASSES = (
    "AQW UW SR WPW 2AVB AT VB ARS STTC SA STE VPB TWO STTU ALS APB 2AVB1 PRIE CCR CR AF AVB QTIE LBBB "
    "VEB SVT RBBB 1AVB STDD MI AFIB TWC PWC ERV RVH LVH ST JEB"
)
TASKS["csn"] = TaskDef(
    "csn",
    "csn",
    {s: f"chapman/chapman_{s}.csv" for s in SPLITS},
    "ecg_path",
    tuple(CSN_CLASSES.split()),
    "CSN",
    ("ecg_path", "age", "diagnose"),
)
GUARDED_TASKS = ("csn",)  # never probed without the leakage guard


def task_label(task: str) -> str:
    """A task's column title in the tables: its label, or a custom task's folder name."""
    return TASKS[task].label if task in TASKS else task.split(":", 1)[-1]


def task_names(spec: str, include_csn: bool = False) -> list[str]:
    """'all' -> the five paper tasks (+ csn with include_csn); otherwise a comma-separated list of names
    or custom:<dir>."""
    paper = list(PAPER_TASKS) + (["csn"] if include_csn else [])
    names = paper if spec == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise EcgposError(f"--task {spec!r} names no task (known: {', '.join(TASKS)}, all, custom:<dir>)")
    for name in names:
        if name not in TASKS and not name.startswith("custom:"):
            raise EcgposError(f"unknown task {name!r} (known: {', '.join(TASKS)}, all, custom:<dir>)")
    return names


def read_table(path: Path, **kwargs: object) -> pd.DataFrame:
    """pandas.read_csv of a user-given CSV; any failure (empty, not text, malformed) is one EcgposError line."""
    try:
        return pd.read_csv(path, **kwargs)
    except Exception as err:  # pandas raises many types (EmptyDataError, ParserError, UnicodeDecodeError)
        raise EcgposError(f"{path}: cannot read CSV ({type(err).__name__}: {str(err).splitlines()[0]})") from None


def _custom_task(folder: Path) -> TaskDef:
    """A custom task: classes are the columns after `record` in train.csv; a `patient_id` column may
    come before `record`."""
    path = folder / "train.csv"
    if not path.is_file():
        raise EcgposError(f"custom task folder {folder} has no train.csv (needs train.csv, val.csv, test.csv)")
    # the header as written: pandas renames a repeated column (A, A.1), which would make it a class of its own
    header = list(read_table(path, header=None, nrows=1, dtype=str, keep_default_na=False).iloc[0])
    if "" in header:
        raise EcgposError(f"{path}: column {header.index('') + 1} of the header has no name")
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise EcgposError(f"{path}: column(s) {', '.join(repeated)} appear more than once in the header")
    if "record" not in header:
        raise EcgposError(f"{path}: no 'record' column (columns: {', '.join(header)})")
    classes = tuple(header[header.index("record") + 1 :])
    if not classes:
        raise EcgposError(f"{path}: no class columns after 'record'")
    files = {s: str((folder / f"{s}.csv").resolve()) for s in SPLITS}
    # an optional patient column before `record`: no patient in two splits, and intervals resample patients
    meta = ("patient_id", "record") if "patient_id" in header[: header.index("record")] else ("record",)
    return TaskDef(f"custom:{folder.name}", "custom", files, "record", classes, folder.name, meta)


def resolve_task(name: str) -> TaskDef:
    """A paper task by name, or `custom:<dir>` read from its folder."""
    if name.startswith("custom:"):
        return _custom_task(Path(name.split(":", 1)[1]).expanduser())
    if name not in TASKS:  # also 'all' or a list, which name several tasks, not one
        raise EcgposError(f"unknown task {name!r} (one of {', '.join(TASKS)}, or custom:<dir>)")
    return TASKS[name]


def resolve_tasks(names: list[str]) -> list[TaskDef]:
    """Each named task once (`resolve_task`). Two different tasks under one name (custom folders of the
    same name) are refused: their rows would be merged into one column as if one task."""
    tasks: dict[str, TaskDef] = {}
    for name in names:
        task = resolve_task(name)
        known = tasks.setdefault(task.name, task)
        if known != task:
            folders = " and ".join(str(Path(t.files["train"]).parent) for t in (known, task))
            raise EcgposError(f"--task: {folders} are both task {task.name}; rename one folder")
    return list(tasks.values())


@dataclass
class SplitTable:
    """One split of one task: record keys (N,), labels (N, C) uint8, the CSV it came from, and the
    patient of each record where the file names one (MERL's PTB-XL and ICBEB files: `patient_id`)."""

    records: list[str]
    labels: np.ndarray
    path: Path
    patients: list[str] | None = None


def read_split(task: TaskDef, splits_root: Path | None, split: str, record_column: str | None = None) -> SplitTable:
    """Read and validate one split CSV: the file must exist, its class columns must be exactly the
    task's classes (by name; labels come back in the task's class order) and hold only 0/1."""
    rel = task.files[split]
    path = Path(rel) if Path(rel).is_absolute() else Path(splits_root or ".") / rel
    if not path.is_file():
        raise EcgposError(f"task {task.name}: split file {path} not found (--splits must hold the MERL split folders)")
    frame = read_table(path, dtype={record_column or task.record_column: str})
    column = record_column or task.record_column
    if column not in frame.columns:
        raise EcgposError(f"{path}: no record column {column!r}")
    # MERL's files do not all list the classes in the same order: match by name, read in task order
    missing = [c for c in task.classes if c not in frame.columns]
    extra = [c for c in frame.columns if c not in task.classes and c not in task.meta]
    if missing or extra:
        detail = "; ".join(
            x
            for x in (
                f"missing {', '.join(missing)}" if missing else "",
                f"unexpected {', '.join(map(str, extra))}" if extra else "",
            )
            if x
        )
        raise EcgposError(
            f"{path}: class columns do not match task {task.name} ({detail}; expected {' '.join(task.classes)})"
        )
    labels = frame[list(task.classes)]
    bad = ~labels.isin([0, 1]).all()
    if bad.any():
        raise EcgposError(f"{path}: class column(s) {', '.join(labels.columns[bad])} hold values other than 0/1")
    patients = [str(p) for p in frame["patient_id"]] if "patient_id" in task.meta else None
    return SplitTable([str(r) for r in frame[column]], labels.to_numpy(np.uint8), path, patients)


def read_splits(task: TaskDef, splits_root: Path | None, record_column: str | None = None) -> dict[str, SplitTable]:
    """All three splits of a task (`read_split` each), which must not share records: a record listed
    twice, or in two splits, would be trained on and tested on, or weigh double, without a word. Nor
    patients, where the files name them: PTB-XL's folds are drawn by patient, and another recording of
    a training patient in val or test is leakage that record keys do not show."""
    tables = {s: read_split(task, splits_root, s, record_column) for s in SPLITS}
    owner: dict[str, str] = {}
    for split, table in tables.items():
        for patient in dict.fromkeys(table.patients or ()):
            if patient in ("", "nan"):  # no patient named: nothing to compare
                continue
            if owner.setdefault(patient, split) != split:
                raise EcgposError(
                    f"task {task.name}: patient {patient} has records in both {owner[patient]} and {split} "
                    f"({table.path}); the splits must not share patients"
                )
    first: dict[str, str] = {}
    for split, table in tables.items():
        for key in table.records:
            if key in ("", "nan"):  # a blank cell: reported as a record not found, not as a repeat
                continue
            if key in first:
                where = f"twice in {split}" if first[key] == split else f"in both {first[key]} and {split}"
                raise EcgposError(
                    f"task {task.name}: record {key} is listed {where} ({table.path}); "
                    "each record must appear in one split, once"
                )
            first[key] = split
    return tables
