"""ecg-arrhythmia (Chapman-Shaoxing + Ningbo, PhysioNet 1.0.0): `WFDBRecords/NN/NNN/JSxxxxx.{hea,mat}`.

Bucket folders hold 100 existing records and ids have gaps, so folders cannot be computed from
ids: the tree under --src is walked (following symlinked folders, each real folder once). The
`RECORDS` files of the release list each folder's records: a listed record with no file anywhere in
the tree (a partial copy) is reported as skipped, not silently left out. JS00001..JS10646 are
Chapman-Shaoxing, JS10647..JS45551 Ningbo (the paper's pretraining pool). 500 Hz, 10 s, 12 leads,
`#Age/#Sex/#Dx` header comments.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ecgpos.ecg.wfdb_fast import read_fast
from ecgpos.ecg.wfdb_io import RawRecord, read_wfdb_record
from ecgpos.errors import EcgposError, SignalError
from ecgpos.files import walk_folders
from ecgpos.preprocessing.records import LoadedRecord, RecordRef

NAME = "ecg-arrhythmia"
FS = 500.0
SUBSETS = {"chapman": (1, 10646), "ningbo": (10647, 45551), "all": (0, 10**9)}
DEFAULT_SUBSET = "ningbo"
INDEX_COLUMNS = ("dx",)  # SNOMED CT codes from `#Dx:`, comma-separated as in the header
# ASCII digits to the end of the name: `$` alone would also accept a name ending in a line break
# ("JS00001\n.hea"), a second id for the same record that no CSV or log line could show as one line
_ID = re.compile(r"JS(\d+)", re.ASCII)


def find_records(src: Path, subset: str = DEFAULT_SUBSET) -> tuple[list[RecordRef], dict[str, int]]:
    """Every JSxxxxx record under src (a .hea or a .mat counts), in the subset, sorted by id.

    Returns (refs, notes): notes counts what was seen outside the subset and the names of `.hea`/`.mat`
    files that are not JSnnnnn (`not_a_record`: not ecg-arrhythmia records; a .hea and its .mat count
    once). A record number found twice (`JS1` and `JS00001`, or one name in two folders) keeps the first
    path in sorted order; the others become `duplicate_record` rows naming it.
    A record that a `RECORDS` file lists but that has no file in the tree is `unreadable`, and so is a
    folder whose entries cannot be read (one ref named after it); EcgposError when src itself cannot be.
    """
    if subset not in SUBSETS:
        raise EcgposError(f"unknown subset {subset!r} (choose from {', '.join(SUBSETS)})")
    low, high = SUBSETS[subset]
    stems: dict[tuple[int, str], set[str]] = {}
    foreign: set[str] = set()  # WFDB-looking files whose name is not an ecg-arrhythmia id
    listed: dict[str, str] = {}  # record id -> location, from the RECORDS files
    walked, unlisted = walk_folders(src)
    if unlisted and unlisted[0][0] == Path("."):
        raise EcgposError(f"--src {src} {unlisted[0][1]}")
    for rel, files in walked:
        for name in files:
            stem, ext = os.path.splitext(name)
            match = _ID.fullmatch(stem)
            if ext in (".hea", ".mat") and match:
                stems.setdefault((int(match.group(1)), (rel / stem).as_posix()), set()).add(ext)
            elif ext in (".hea", ".mat"):
                foreign.add((rel / stem).as_posix())
        if "RECORDS" in files:
            for entry in _records_file(src / rel / "RECORDS"):
                listed.setdefault(Path(entry).name, (rel / entry).as_posix())
    # a record is its number: JS1 and JS00001 (or one name in two folders) are one record found twice
    found = {number for number, _ in stems}
    for record_id, location in listed.items():
        match = _ID.fullmatch(record_id)
        if match and int(match.group(1)) not in found:
            found.add(int(match.group(1)))
            stems[(int(match.group(1)), location)] = set()
    refs, first, outside = [], {}, 0
    # sorted by (number, path): which copy is kept does not depend on the order the tree was walked in
    for (number, location), exts in sorted(stems.items()):
        if not low <= number <= high:
            outside += 1
            continue
        record_id = Path(location).name
        problem = None
        if not exts:
            problem = ("unreadable", f"listed in {Path(location).parent / 'RECORDS'} but no .hea/.mat file found")
        elif number in first:
            problem = ("duplicate_record", f"the same record number ({number}) as {first[number]}, which is kept")
        elif ".hea" not in exts:
            problem = ("unreadable", "no .hea header beside the .mat")
        first.setdefault(number, location)
        refs.append(RecordRef(record_id=record_id, location=location, problem=problem))
    # one skipped row per folder whose entries cannot be read: its records cannot be counted, the report says where
    refs += [
        RecordRef(rel.as_posix(), rel.as_posix(), problem=("unreadable", f"folder {why}")) for rel, why in unlisted
    ]
    return refs, {"outside_subset": outside, "not_a_record": len(foreign)}


def _records_file(path: Path) -> list[str]:
    """Record paths listed in a WFDB `RECORDS` file (relative to its folder); folder entries
    (ending in '/') are left out, their own RECORDS files list their records."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip() and not line.strip().endswith("/")]


def load_record(src: Path, ref: RecordRef) -> LoadedRecord:
    """Read one record in mV with its Age/Sex/Dx metadata; raises SignalError."""
    if ref.problem:
        raise SignalError(*ref.problem)
    base = src / ref.location
    if not base.with_suffix(".mat").is_file() and not base.with_suffix(".dat").is_file():
        raise SignalError("unreadable", f"{ref.record_id}: signal file missing")
    raw = read_fast(base)
    if raw is None:  # a header outside the fast path: let wfdb read it
        raw = read_wfdb_record(base)
    _check_own_header(raw, ref.record_id)
    fields = raw.header_fields()
    meta = {
        "patient_id": "",
        "age": _age(fields.get("Age", "")),
        "sex": _sex(fields.get("Sex", "")),
        "dx": fields.get("Dx", ""),
    }
    return LoadedRecord(
        signal=raw.signal, fs=raw.fs, leads=raw.leads, meta=meta, total=raw.total, uncalibrated=raw.uncalibrated
    )


def _check_own_header(raw: RawRecord, record_id: str) -> None:
    """SignalError('header_mismatch') unless the header describes `record_id` and reads its own signal
    file: a header copied from another record (its record line names that record) or naming another
    record's `.mat` would store that record's samples, and for a copy its Age/Sex/Dx, under this id."""
    if raw.record_name != record_id:
        raise SignalError("header_mismatch", f"{record_id}.hea describes record {raw.record_name!r}")
    other = [name for name in raw.signal_files if name not in (f"{record_id}.mat", f"{record_id}.dat")]
    if other:
        raise SignalError("header_mismatch", f"{record_id}.hea reads its samples from {other[0]}, not {record_id}.mat")


def _age(text: str) -> str:
    return text if text.strip().isdigit() else ""


def _sex(text: str) -> str:
    text = text.strip().lower()
    return "M" if text.startswith("m") else "F" if text.startswith("f") else ""
