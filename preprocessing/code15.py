"""CODE-15 (Zenodo): `exams.csv` + `exams_part{0..17}.hdf5` (`tracings` (N, 4096, 12) float32 mV at 400 Hz).

Lead order DI, DII, DIII, AVR, AVL, AVF, V1..V6. Exams shorter than 4096 samples (7 s = 2800,
10 s = 4000) are zero-padded symmetrically: `true_extent` recovers the recorded span so that
filtering never sees the padding. The last row of every part is exam_id 0 with an all-zero trace:
a padding row, not an exam, so it is not counted as found (preprocess.json reports how many).
Records are ordered by (part number, row): each shard then reads one part sequentially. exams.csv
rows of one exam that disagree make its metadata ambiguous (`duplicate_exam_rows`); exact repeats
are one row (`read_exams`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
import pandas as pd

from ecgpos.ecg.rates import check_fs
from ecgpos.errors import EcgposError, SignalError
from ecgpos.preprocessing.records import LoadedRecord, RecordRef

NAME = "code15"
FS = 400.0
LEADS = ["DI", "DII", "DIII", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]
INDEX_COLUMNS = ("1dAVb", "RBBB", "LBBB", "SB", "ST", "AF", "normal_ecg")
_PART = re.compile(r"^exams_part(\d+)\.hdf5$")
_open_parts: dict[str, h5py.File] = {}  # per process: parts stay open while a worker reads rows


def true_extent(trace: np.ndarray) -> tuple[int, int]:
    """(start, stop) of the recorded span of a symmetrically zero-padded (time, leads) trace.

    The non-zero span is trusted where padding is (near) symmetric; if a recorded edge sample is
    itself zero on every lead, the side with less padding is mirrored. (0, 0) for an all-zero trace.
    """
    nonzero = np.flatnonzero(np.any(trace != 0, axis=1))
    if nonzero.size == 0:
        return 0, 0
    start, stop = int(nonzero[0]), int(nonzero[-1]) + 1
    left, right = start, trace.shape[0] - stop
    if abs(left - right) <= 1:
        return start, stop
    pad = min(left, right)
    return pad, trace.shape[0] - pad


def _bool01(value) -> str:
    if isinstance(value, str):
        return "1" if value.strip().lower() in ("true", "1") else "0" if value.strip() else ""
    return "" if value is None or (isinstance(value, float) and np.isnan(value)) else str(int(bool(value)))


def _text(value) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


@dataclass(frozen=True)
class Exams:
    """exams.csv as the reader uses it: one row per exam, and what its repeated rows said."""

    table: pd.DataFrame  # indexed by exam_id: an exam's first row
    conflicts: dict[int, tuple[int, list[str]]]  # exam -> (its rows, the columns on which they disagree)
    trace_files: dict[int, list[str]]  # exam with conflicting rows -> the parts its rows name
    repeated: int  # rows identical to an earlier row of their exam: left out, counted


_tables: dict[str, Exams] = {}  # per process: exams.csv read once


def _file_key(path: Path) -> str:
    """Cache key that changes when the file is replaced (a long-lived process may see new files)."""
    try:
        stat = path.stat()
    except OSError:
        return str(path)
    return f"{path}|{stat.st_mtime_ns}|{stat.st_size}"


def read_exams(src: Path) -> Exams:
    """exams.csv, read once per process and kept compact. An exam's rows that repeat one another exactly
    are one row (counted in `repeated`); rows that disagree leave the exam's age, sex or labels
    ambiguous, so the exam is listed in `conflicts` (and skipped as `duplicate_exam_rows`)."""
    path = src / "exams.csv"
    key = _file_key(path)
    if key not in _tables:
        try:
            table = pd.read_csv(path, low_memory=False)
        except (OSError, ValueError) as err:
            raise EcgposError(f"cannot read {path}: {err}".splitlines()[0]) from None
        if "exam_id" not in table.columns:
            raise EcgposError(f"{path} has no exam_id column")
        # every row must name its exam: a blank or non-integer id cannot be matched with a tracing
        ids = pd.to_numeric(table["exam_id"], errors="coerce")
        bad = ids.isna() | (ids % 1 != 0)
        if bad.any():
            first = int(np.flatnonzero(bad.to_numpy())[0])
            value = table["exam_id"].iloc[first]
            shown = "is blank" if pd.isna(value) else f"{str(value)!r} is not an integer"
            raise EcgposError(f"{path} line {first + 2}: exam_id {shown}; every row must name its exam")
        table["exam_id"] = ids.astype(np.int64)
        copies = table.duplicated()  # whole rows, blanks equal to blanks
        distinct = table[~copies]
        several = distinct[distinct["exam_id"].duplicated(keep=False)]
        conflicts, trace_files = {}, {}
        if len(several):
            rows_of = table["exam_id"].value_counts()
        for exam_id, rows in several.groupby("exam_id", sort=True):
            fields = [c for c in rows.columns if c != "exam_id" and rows[c].nunique(dropna=False) > 1]
            conflicts[int(exam_id)] = (int(rows_of[exam_id]), fields)
            if "trace_file" in rows.columns:
                trace_files[int(exam_id)] = sorted(set(rows["trace_file"].astype(str)))
        table = distinct.drop_duplicates("exam_id").set_index("exam_id")
        _tables[key] = Exams(table, conflicts, trace_files, int(copies.sum()))
    return _tables[key]


def _row_meta(row: pd.Series) -> dict[str, str]:
    """index.csv fields of one exams.csv row: patient_id, age, sex (M/F), the labels as 0/1."""
    meta = {
        "patient_id": _text(row.get("patient_id")),
        "age": _text(row.get("age")),
        "sex": {"1": "M", "0": "F"}.get(_bool01(row.get("is_male")), ""),
    }
    meta.update({name: _bool01(row.get(name)) for name in INDEX_COLUMNS})
    return meta


def _exam_ids(values: np.ndarray) -> np.ndarray:
    """A part's `exam_id` dataset as int64; ValueError unless it is one whole number per row
    (a fractional id would be truncated onto another exam's metadata)."""
    values = np.asarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        raise ValueError(f"exam_id has shape {values.shape} and dtype {values.dtype}, expected one integer per row")
    if values.dtype.kind == "f" and not np.all(np.isfinite(values) & (values % 1 == 0)):
        raise ValueError("exam_id holds values that are not whole numbers")
    return values.astype(np.int64)


def find_records(src: Path, subset: str | None = None) -> tuple[list[RecordRef], dict[str, int]]:
    """Every exam in every `exams_partN.hdf5` under src, ordered by (part, row); exam_id 0 rows left out."""
    if subset not in (None, "all"):
        raise EcgposError("--subset applies to ecg-arrhythmia only")
    parts = sorted((int(m.group(1)), p) for p in src.glob("exams_part*.hdf5") if (m := _PART.match(p.name)))
    if not parts:
        return [], {}
    exams = read_exams(src)
    known = set(exams.table.index.tolist())
    trace_file = exams.table["trace_file"].astype(str) if "trace_file" in exams.table.columns else pd.Series(dtype=str)
    trace_file = trace_file[~trace_file.index.isin(list(exams.conflicts))]  # those have several: see below
    seen, padding, readable = set(), 0, set()
    per_part: list[list[RecordRef] | tuple[str, str]] = []  # a part's refs, or (name, why) of an unreadable part
    for _, path in parts:
        try:
            with h5py.File(path, "r") as f:
                exam_ids = _exam_ids(f["exam_id"][:])
                shape, dtype = f["tracings"].shape, f["tracings"].dtype
            if dtype.kind != "f":  # integers would be ADC counts read as mV
                raise ValueError(f"tracings dtype {dtype}, expected float mV")
            if len(shape) != 3 or shape[0] != exam_ids.shape[0] or shape[2] != 12:
                raise ValueError(f"tracings shape {shape} does not match {exam_ids.shape[0]} exam ids x 12 leads")
        except Exception as err:  # h5py raises OSError/KeyError/ValueError for damaged files
            per_part.append((path.name, f"{path.name}: {type(err).__name__}: {err}".splitlines()[0]))
            continue
        readable.add(path.name)
        part_refs = []
        for row, exam_id in enumerate(exam_ids.tolist()):
            if exam_id == 0:
                padding += 1
                continue
            problem = None
            if exam_id in seen:
                problem = ("duplicate_record", f"exam {exam_id} appears in more than one row")
            elif exam_id not in known:
                problem = ("missing_metadata", f"exam {exam_id} has no exams.csv row")
            elif exam_id in exams.conflicts:
                problem = _conflict(exams, exam_id)
            seen.add(exam_id)
            part_refs.append(RecordRef(str(exam_id), path.name, row=row, problem=problem))
        per_part.append(part_refs)
    # an unreadable part stands for the exams.csv rows placed in it, except exams that a readable part
    # holds (those are that part's records: counted once, not also skipped); else for itself
    refs: list[RecordRef] = []
    for entry in per_part:
        if isinstance(entry, list):
            refs += entry
            continue
        name, detail = entry
        listed = sorted(int(eid) for eid in trace_file.index[trace_file == name] if eid not in seen)
        refs += [RecordRef(str(eid), name, problem=("unreadable_part", detail)) for eid in listed] or [
            RecordRef(name, name, problem=("unreadable_part", detail))
        ]
    # exams.csv rows that name a readable part here which does not hold them: reported, not lost
    held = {str(e) for e in seen}
    tail = [
        (part, str(eid), ("unreadable", f"exams.csv puts exam {eid} in {part}, which does not hold it"))
        for eid, part in trace_file.items()
        if part in readable and str(eid) not in held
    ]
    # an exam whose rows disagree, held by no readable part: found once when a row names a part that is here
    present = {path.name for _, path in parts}
    for eid in exams.conflicts:
        here = sorted(set(exams.trace_files.get(eid, [])) & present)
        if eid not in seen and here:
            tail.append((here[0], str(eid), _conflict(exams, eid)))
    refs += [RecordRef(eid, part, problem=problem) for part, eid, problem in sorted(tail)]
    return refs, {"padding_rows": padding, **({"repeated_exam_rows": exams.repeated} if exams.repeated else {})}


def _conflict(exams: Exams, exam_id: int) -> tuple[str, str]:
    """The skip of an exam whose exams.csv rows disagree, naming the columns."""
    rows, fields = exams.conflicts[exam_id]
    return ("duplicate_exam_rows", f"exams.csv has {rows} rows for exam {exam_id} that disagree on {', '.join(fields)}")


def load_record(src: Path, ref: RecordRef) -> LoadedRecord:
    """One exam's recorded span as (12, time) float32 mV in CODE-15 lead order; raises SignalError."""
    if ref.problem:
        raise SignalError(*ref.problem)
    key = _file_key(src / ref.location)
    try:
        if key not in _open_parts:
            _open_parts[key] = h5py.File(src / ref.location, "r")
        trace = np.asarray(_open_parts[key]["tracings"][ref.row], dtype=np.float32)
    except Exception as err:
        detail = f"{ref.location} row {ref.row}: {type(err).__name__}: {err}".splitlines()[0]
        raise SignalError("unreadable", detail) from None
    start, stop = true_extent(trace)
    if stop == start:  # zero padding only: reported as all_zero (what the file holds), not as empty
        start, stop = 0, trace.shape[0]
    meta = _row_meta(read_exams(src).table.loc[int(ref.record_id)])
    return LoadedRecord(signal=np.ascontiguousarray(trace[start:stop].T), fs=check_fs(FS), leads=list(LEADS), meta=meta)
