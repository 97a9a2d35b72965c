"""Finding and reading probe records: PTB-XL (WFDB), CPSC2018 (three published forms), custom WFDB;
which records of a task's splits the data root holds (`check_records`).

Layouts under --data-root:
- ptbxl/records500/00000/00001_hr.{hea,dat} (records100/..._lr at 100 Hz), as published.
- ecg-arrhythmia/WFDBRecords/NN/NNN/JSxxxxx.{hea,mat} (PhysioNet ecg-arrhythmia 1.0.0) for MERL's
  Chapman-Shaoxing-Ningbo task (csn).
- cpsc2018/ in any of the published forms, anywhere below it (found by walking the tree once):
  the original challenge files (`A0001.mat`, a MATLAB struct `ECG` with sex, age, data 12 x N
  float64 mV at 500 Hz, no header), the CinC 2020 WFDB form (`A0001.hea` + `.mat`, abbreviations
  in #Dx) and the final CinC WFDB form (SNOMED codes in #Dx). A record held in several forms is
  read from the original one (float64 source values, the other two are rounded to 1 uV).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import scipy.io

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.ecg.screening import ScreenPolicy, screen_record
from ecgpos.ecg.signal import preprocess_batch
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.ecg.wfdb_fast import read_wfdb
from ecgpos.ecg.wfdb_io import RawRecord
from ecgpos.errors import EcgposError, SignalError
from ecgpos.probes.shared.tasks import SplitTable, TaskDef

CPSC_FS = 500.0
PROBE_POLICY = ScreenPolicy(pad_short=True, check_limb_leads=False)
"""Probe records pass preprocessing's screening (rate, empty, NaN, all-zero, flat, dead leads) with
two documented differences, both because the probe protocol uses the published splits as they are:
a record shorter than the window is kept and zero-padded at the end (as `ecgpos preprocess
--pad-short` / `ecgpos embed --pad-short` do), short CPSC2018 records included; and limb leads that
break Einthoven's relations (lead_mismatch) are kept, as every published result kept them (PTB-XL
flags some recordings' electrode problems in its metadata and leaves them in its folds). Padded
and mismatched records are logged.
Features, geometry and the leakage guard all read records through `prepared_record`."""
CPSC_FORMS = ("original", "cinc2020", "cinc-snomed")  # read-preference order


def cpsc_wfdb_form(header: Path) -> str:
    """'cinc-snomed' when the header's #Dx holds SNOMED codes (digits), else 'cinc2020' (abbreviations)."""
    for line in header.read_text(errors="replace").splitlines():
        if line.lstrip("#").strip().lower().startswith("dx:"):
            codes = [c.strip() for c in line.split(":", 1)[1].split(",") if c.strip()]
            return "cinc-snomed" if codes and all(c.isdigit() for c in codes) else "cinc2020"
    return "cinc2020"


def index_cpsc(root: Path) -> dict[str, dict[str, Path]]:
    """Walk cpsc2018/ once: A-number -> {form: record path (extension stripped for WFDB)}; of two
    copies in one form, the first in sorted path order."""
    found: dict[str, dict[str, Path]] = {}
    if not root.is_dir():
        return found
    for folder, dirs, files in os.walk(root):
        dirs.sort()  # a record held twice: the first copy in sorted order, on every machine
        names = set(files)
        for name in sorted(files):
            stem, ext = os.path.splitext(name)
            if ext != ".mat" or not stem.startswith("A"):
                continue
            base = Path(folder) / stem
            form = cpsc_wfdb_form(base.with_suffix(".hea")) if f"{stem}.hea" in names else "original"
            found.setdefault(stem, {}).setdefault(form, base)
    return found


def read_cpsc_original(path: Path) -> RawRecord:
    """The original CPSC2018 .mat: struct ECG {sex, age, data (12, N) float64 mV}, 500 Hz, standard lead order."""
    try:
        mat = scipy.io.loadmat(str(path.with_suffix(".mat")), squeeze_me=True, struct_as_record=False)
        ecg = mat["ECG"]
        data = np.asarray(ecg.data, dtype=np.float64)
        sex, age = str(ecg.sex), str(ecg.age)
    except Exception as err:  # scipy raises several types for truncated or foreign .mat files
        raise SignalError(
            "unreadable",
            f"{path.stem}: not a CPSC2018 ECG struct ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''})",
        ) from None
    if data.ndim != 2 or data.shape[0] != len(CANONICAL_LEADS):
        raise SignalError("unreadable", f"{path.stem}: ECG.data has shape {data.shape}, expected (12, N)")
    return RawRecord(
        record_id=path.stem,
        signal=data.astype(np.float32),
        fs=CPSC_FS,
        leads=list(CANONICAL_LEADS),
        comments=[f"Age: {age}", f"Sex: {sex}"],
    )


def _escapes(key: str) -> bool:
    """A split key that leads out of its dataset folder (absolute, or up through `..`): such a record is
    not under the data root, whatever it points at."""
    return os.path.isabs(key) or os.path.normpath(key).split(os.sep)[0] == ".."


@dataclass
class RecordLocator:
    """Maps a split's record key to a readable path for one dataset under the data root."""

    dataset: str
    data_root: Path
    base: Path | None = None  # custom tasks: folder the record paths are relative to
    _cpsc: dict[str, dict[str, Path]] | None = None
    _dirs: dict[Path, frozenset[str]] | None = None
    _ids: dict[str, Path] | None = None  # csn: record id -> path, from one walk of the tree

    def locate(self, key: str) -> tuple[Path, str] | None:
        """(record path, form) or None when the record is not under the data root."""
        if self.dataset == "cpsc2018":
            if self._cpsc is None:
                self._cpsc = index_cpsc(self.data_root / "cpsc2018")
            forms = self._cpsc.get(key, {})
            for form in CPSC_FORMS:
                if form in forms:
                    return forms[form], form
            return None
        if self.dataset == "csn":
            return self._locate_csn(key)
        if self.dataset == "ptbxl":
            if _escapes(key):
                return None
            path = self.data_root / "ptbxl" / key
        else:
            path = Path(key) if Path(key).is_absolute() else (self.base or self.data_root) / key
        path = path.with_suffix("") if path.suffix in (".hea", ".dat", ".mat") else path
        # one directory listing per folder instead of a stat per split row (21,799 rows for PTB-XL)
        return (path, "wfdb") if f"{path.name}.hea" in self._listing(path.parent) else None

    def _locate_csn(self, key: str) -> tuple[Path, str] | None:
        """MERL's `/chapman/WFDBRecords/NN/NNN/JSxxxxx.mat` under ecg-arrhythmia/; a record not at that
        path is looked up by id in one walk of the tree (a reorganised copy still works)."""
        root = self.data_root / "ecg-arrhythmia"
        rel = Path(*[p for p in Path(key).parts if p not in ("/", "chapman")]).with_suffix("")
        if ".." in rel.parts:
            return None
        path = root / rel
        if f"{path.name}.hea" in self._listing(path.parent):
            return path, "wfdb"
        if self._ids is None:
            self._ids = {}
            for folder, dirs, files in os.walk(root):
                dirs.sort()  # a record held twice: the first copy in sorted order, on every machine
                for name in sorted(files):
                    if name.endswith(".hea"):
                        self._ids.setdefault(name[:-4], Path(folder) / name[:-4])
        found = self._ids.get(path.name)
        return (found, "wfdb") if found is not None else None

    def _listing(self, folder: Path) -> frozenset[str]:
        if self._dirs is None:
            self._dirs = {}
        if folder not in self._dirs:
            try:
                self._dirs[folder] = frozenset(os.listdir(folder))
            except OSError:  # absent or unreadable folder: nothing in it can be found
                self._dirs[folder] = frozenset()
        return self._dirs[folder]


def read_record(path: Path, form: str) -> RawRecord:
    """Read one located record in mV; raises SignalError (never a library traceback)."""
    if form == "original":
        return read_cpsc_original(path)
    return read_wfdb(path)


def record_stamp(path: Path, form: str) -> str:
    """A cheap stamp of the files a located record is read from: its path and form and the size and
    mtime_ns of `<path>.hea`, `.dat` and `.mat` (the original CPSC2018 form: `.mat` alone).

    It changes when one of them is edited, replaced, added or removed, or when the record is found
    at another path or in another form; no content is read (a few stat calls per record). Data files
    under other names than the record's (multi-file WFDB records) are not covered.
    """
    parts = [form, str(path)]
    for suffix in (".mat",) if form == "original" else (".hea", ".dat", ".mat"):
        try:
            stat = os.stat(f"{path}{suffix}")
            parts.append(f"{suffix}:{stat.st_size}:{stat.st_mtime_ns}")
        except OSError:  # an absent file is part of the state too: one appearing changes the stamp
            parts.append(f"{suffix}:-")
    return hashlib.blake2b("|".join(parts).encode(), digest_size=8).hexdigest()


def prepared_record(path: Path, form: str, spec: PreprocessSpec, mismatched: list[str] | None = None) -> np.ndarray:
    """One located record read, screened (PROBE_POLICY) and preprocessed under `spec`: float32
    (12, T) at spec.fs, possibly shorter than a window. Raises EcgposError with the skip reason.
    `mismatched`, when given, gets the record's lead_mismatch detail if its limb leads break
    Einthoven's relations (the record is kept all the same), so that the caller can report them."""
    raw = read_record(path, form)
    screen = (raw.signal, raw.fs, raw.leads, spec)
    try:
        policy = PROBE_POLICY if mismatched is None else _LIMBS_CHECKED
        ok = screen_record(*screen, policy, uncalibrated=raw.uncalibrated)
    except SignalError as err:
        if err.reason != "lead_mismatch" or mismatched is None:
            raise
        mismatched.append(err.detail)
        ok = screen_record(*screen, PROBE_POLICY, uncalibrated=raw.uncalibrated)
    return preprocess_batch(ok.signal[None], ok.fs, spec, ok.dead[None])[0]


_LIMBS_CHECKED = dataclasses.replace(PROBE_POLICY, check_limb_leads=True)  # only to report, never to skip


def task_locator(task: TaskDef, data_root: Path) -> RecordLocator:
    """The locator of a task's records (custom tasks: paths relative to their split folder)."""
    base = Path(task.files["train"]).parent if task.dataset == "custom" else None
    return _cached_locator(task.dataset, Path(data_root).resolve(), base)


@lru_cache(maxsize=16)
def _cached_locator(dataset: str, data_root: Path, base: Path | None) -> RecordLocator:
    """One locator (and one directory scan) per dataset and root within a process."""
    return RecordLocator(dataset, data_root, base)


def missing_records(task: TaskDef, table: SplitTable, data_root: Path) -> list[str]:
    """Record keys of a split that are not under the data root."""
    locator = task_locator(task, data_root)
    return [k for k in table.records if locator.locate(k) is None]


def check_distinct(task: TaskDef, tables: dict[str, SplitTable], data_root: Path) -> None:
    """EcgposError when two keys of a task's splits name one record file (`r1` and `r1.hea`, `a/../r1`,
    an absolute and a relative path, a link): read_splits compares keys as written, so such a record
    would be trained on and tested on without a word."""
    locator = task_locator(task, data_root)
    first: dict[str, tuple[str, str]] = {}
    folders: dict[Path, str] = {}  # one realpath per folder, not per record (21,799 for PTB-XL)
    for split, table in tables.items():
        for key in table.records:
            found = locator.locate(key)
            if found is None:
                continue
            parent = found[0].parent
            if parent not in folders:
                folders[parent] = os.path.realpath(parent)
            where = os.path.join(folders[parent], found[0].name)
            if where in first and first[where][0] != key:
                split0, key0 = first[where][1], first[where][0]
                raise EcgposError(
                    f"task {task.name}: {key} ({split}) and {key0} ({split0}) are the same record ({where}); "
                    "each record must appear in one split, once"
                )
            first.setdefault(where, (key, split))


def missing_report(task: str, split: str, ids: Sequence[str], total: int, first: int = 5) -> str:
    """One line: how many records of a split are absent, and the first few ids."""
    shown = ", ".join(ids[:first]) + (", ..." if len(ids) > first else "")
    return f"{task} {split}: {len(ids)} of {total} records not found under the data root, excluded ({shown})"


DATA_FOLDERS = {"ptbxl": "ptbxl/", "cpsc2018": "cpsc2018/", "csn": "ecg-arrhythmia/"}


def check_records(task: TaskDef, tables: dict[str, SplitTable], data_root: Path | None, require_complete: bool) -> None:
    """One line when two keys name one record (`check_distinct`), when a split misses records under
    --require-complete, or when no record of the task is found at all (a --data-root holding another
    dataset would otherwise give a table of NaN rows)."""
    root = data_root or Path(".")
    check_distinct(task, tables, root)
    missing = {split: missing_records(task, table, root) for split, table in tables.items()}
    for split, ids in missing.items():
        if ids and require_complete:
            line = missing_report(task.name, split, ids, len(tables[split].records)).replace(", excluded", "")
            raise EcgposError(line + " (--require-complete)")
    total = sum(len(t.records) for t in tables.values())
    if total and sum(map(len, missing.values())) == total:
        first = next(ids[0] for ids in missing.values() if ids)
        where = (
            f"--data-root {root} must be the folder holding {DATA_FOLDERS[task.dataset]}"
            if task.dataset in DATA_FOLDERS
            else f"record paths are read relative to {Path(task.files['train']).parent}"
        )
        other = {"records500": ("records100", "--records100"), "records100": ("records500", "no --records100")}
        folder, flag = other.get(first.split("/")[0], ("", ""))
        if task.dataset == "ptbxl" and folder and (root / "ptbxl" / folder).is_dir():
            where += f" (it holds ptbxl/{folder}/: {flag}?)"
        raise EcgposError(f"{task.name}: none of the {total} records of its splits was found (e.g. {first}); {where}")
