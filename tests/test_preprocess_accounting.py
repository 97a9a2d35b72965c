"""Every input record appears exactly once in index.csv or skipped.csv, and stored samples are the
record's own: CODE-15 tables and parts that disagree, headers of other records, unlistable folders.

Each case drives `ecgpos preprocess` on copies of the real samples or on CODE-15 files in the
published layout, and checks the rows that account for every record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from code15_fixtures import FS as CODE15_FS
from code15_fixtures import ecg_like, exam_row, padded_trace, write_exams_csv, write_part
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from refusal_helpers import ROOT, copy_record, read_rows, run, unprivileged

from ecgpos.cli import main

TEN = padded_trace(ecg_like(4000, CODE15_FS, 1))


def _outcome(out: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(stored record ids, (record id, reason) of the skipped ones)."""
    stored = [r["record_id"] for r in read_rows(out / "index.csv")]
    return stored, [(r["record_id"], r["reason"]) for r in read_rows(out / "skipped.csv")]


def test_code15_exam_held_by_a_readable_part_is_not_also_skipped_for_an_unreadable_one(capsys, tmp_path):
    """exams.csv placing exam 2 in an unreadable part while a readable part holds it: the exam was
    stored and also skipped as unreadable_part (found 4 for 3 exams)."""
    src = tmp_path / "c15"
    write_part(src, 1, [1, 2], [TEN, TEN])
    (src / "exams_part0.hdf5").write_bytes(b"not an HDF5 file" * 8)  # sorts before the part holding exam 2
    write_exams_csv(src, [exam_row(1, 1), exam_row(2, 0), exam_row(7, 0)])
    rc, out, err = run(capsys, "preprocess", "code15", "--src", src, "--out", tmp_path / "o")
    assert rc == 0 and "stored 2 + skipped 1 = found 3" in out, out + err
    assert _outcome(tmp_path / "o") == (["1", "2"], [("7", "unreadable_part")])
    # every exams.csv row of the unreadable part is held elsewhere: the part itself is still reported
    write_exams_csv(src, [exam_row(1, 1), exam_row(2, 0)])
    rc, out, err = run(capsys, "preprocess", "code15", "--src", src, "--out", tmp_path / "o2")
    assert rc == 0 and "stored 2 + skipped 1 = found 3" in out, out + err
    assert _outcome(tmp_path / "o2") == (["1", "2"], [("exams_part0.hdf5", "unreadable_part")])


def test_a_header_of_another_record_is_header_mismatch(capsys, tmp_path, shared_data):
    """A header copied from another record, or naming another record's .mat, stored that record's
    samples (and, for the copy, its Age/Sex/Dx) under this id, with no skip."""
    real = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010"
    bucket = tmp_path / "src" / "WFDBRecords" / "01" / "010"
    bucket.mkdir(parents=True)
    for name in ("JS00001", "JS00002"):
        for ext in (".hea", ".mat"):
            shutil.copyfile(real / f"{name}{ext}", bucket / f"{name}{ext}")
    for name in ("JS00004", "JS00005", "JS00006"):
        shutil.copyfile(real / f"{name}.mat", bucket / f"{name}.mat")
    header = (real / "JS00001.hea").read_text()
    shutil.copyfile(real / "JS00002.hea", bucket / "JS00004.hea")  # a verbatim copy of another header
    (bucket / "JS00005.hea").write_text(header.replace("JS00001 12", "JS00005 12"))  # reads JS00001.mat
    # the same outside the fast path (lower-case units): wfdb reads it
    (bucket / "JS00006.hea").write_text(header.replace("JS00001 12", "JS00006 12").replace("/mV", "/mv"))
    rc, out, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "o"
    )
    assert rc == 0 and "stored 2 + skipped 3 = found 5" in out, out + err
    skipped = {r["record_id"]: (r["reason"], r["detail"]) for r in read_rows(tmp_path / "o" / "skipped.csv")}
    assert skipped == {
        "JS00004": ("header_mismatch", "JS00004.hea describes record 'JS00002'"),
        "JS00005": ("header_mismatch", "JS00005.hea reads its samples from JS00001.mat, not JS00005.mat"),
        "JS00006": ("header_mismatch", "JS00006.hea reads its samples from JS00001.mat, not JS00006.mat"),
    }
    # a record's own header still passes both readers
    (bucket / "JS00002.hea").write_text((real / "JS00002.hea").read_text().replace("/mV", "/mv"))
    rc, out, err = run(
        capsys, "preprocess", "ecg-arrhythmia", "--src", tmp_path / "src", "--subset", "all", "--out", tmp_path / "o2"
    )
    assert rc == 0 and "stored 2 + skipped 3 = found 5" in out, out + err


def preprocess_locked(src: Path, locked: Path, mode: int, tmp_path: Path) -> subprocess.CompletedProcess:
    """`ecgpos preprocess` without root's capabilities while src/locked has `mode`: on src (into
    tmp_path/o), then on src/locked itself (into tmp_path/o2); each run prints `rc N`."""
    script = (
        "import sys; from ecgpos.cli import main\n"
        "for src, out in ((sys.argv[1], sys.argv[2]), (sys.argv[4], sys.argv[3])):\n"
        "    print('rc', main(['preprocess', 'ecg-arrhythmia', '--subset', 'all', '--src', src, '--out', out]))\n"
    )
    (src / locked).chmod(mode)
    try:
        return subprocess.run(
            [*unprivileged(), sys.executable, "-c", script, src, tmp_path / "o", tmp_path / "o2", src / locked],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
    finally:
        (src / locked).chmod(0o755)


def test_a_folder_that_cannot_be_listed_is_a_counted_skip(tmp_path, shared_data):
    """os.walk left an unreadable folder out without a word: its records vanished from the count."""
    real = shared_data / "ecg-arrhythmia" / "WFDBRecords"
    src = tmp_path / "src"
    shutil.copytree(real / "01" / "010", src / "WFDBRecords" / "01" / "010")
    shutil.copytree(real / "02" / "020", src / "WFDBRecords" / "02" / "020")
    proc = preprocess_locked(src, Path("WFDBRecords/02"), 0, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    codes = [line for line in proc.stdout.splitlines() if line.startswith("rc ")]
    assert codes == ["rc 0", "rc 2"], proc.stdout + proc.stderr
    assert "stored 100 + skipped 1 = found 101" in proc.stdout, proc.stdout
    assert read_rows(tmp_path / "o" / "skipped.csv") == [
        {
            "source": "ecg-arrhythmia",
            "record_id": "WFDBRecords/02",
            "reason": "unreadable",
            "detail": "folder cannot be listed (Permission denied)",
        }
    ]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [f"ecgpos preprocess: error: --src {src}/WFDBRecords/02 cannot be listed (Permission denied)"]


def test_a_folder_without_search_permission_is_one_counted_skip(tmp_path, shared_data):
    """A folder of mode 0444 lists its names but none can be opened: its records were skipped one by one
    as 'signal file missing', its subfolder as a folder of its own, and a folder it links to (taken for a
    file) was lost without a word."""
    real = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010"
    src, shelf = tmp_path / "src", tmp_path / "src" / "shelf"
    copy_record(real / "JS00001", src / "open", "JS00001")
    copy_record(real / "JS00001", shelf, "JS00002")
    copy_record(real / "JS00001", shelf / "sub", "JS00003")
    copy_record(real / "JS00001", tmp_path / "elsewhere", "JS00004")
    (shelf / "linked").symlink_to(tmp_path / "elsewhere")
    proc = preprocess_locked(src, Path("shelf"), 0o444, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    codes = [line for line in proc.stdout.splitlines() if line.startswith("rc ")]
    assert codes == ["rc 0", "rc 2"], proc.stdout + proc.stderr
    assert "stored 1 + skipped 1 = found 2" in proc.stdout, proc.stdout
    why = "cannot be searched: its entries cannot be opened (Permission denied)"
    assert read_rows(tmp_path / "o" / "skipped.csv") == [
        {"source": "ecg-arrhythmia", "record_id": "shelf", "reason": "unreadable", "detail": f"folder {why}"}
    ]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == [f"ecgpos preprocess: error: --src {shelf} {why}"]


def test_one_record_number_twice_is_a_duplicate_naming_the_copy_kept(capsys, tmp_path, shared_data):
    """JS1 and JS00001 (one record number) were stored as two records; one name in two folders was a
    duplicate_record that did not say which copy was kept."""
    real = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010" / "JS00001"
    src = tmp_path / "src"
    # made in the reverse of path order: the copy kept must not depend on the order the tree is walked in
    copy_record(real, src / "b", "JS00001")
    copy_record(real, src / "a", "JS1")
    copy_record(real, src / "a", "JS00001")
    copy_record(real.with_name("JS00002"), src / "b", "JS02")  # a short id alone is that record
    rc, out, err = run(capsys, "preprocess", "ecg-arrhythmia", "--src", src, "--subset", "all", "--out", tmp_path / "o")
    assert rc == 0 and "stored 2 + skipped 2 = found 4" in out, out + err
    assert [r["record_id"] for r in read_rows(tmp_path / "o" / "index.csv")] == ["JS00001", "JS02"]
    kept = "the same record number (1) as a/JS00001, which is kept"
    assert [(r["record_id"], r["reason"], r["detail"]) for r in read_rows(tmp_path / "o" / "skipped.csv")] == [
        ("JS1", "duplicate_record", kept),
        ("JS00001", "duplicate_record", kept),
    ]


def test_code15_exams_csv_rows_of_one_exam(capsys, tmp_path):
    """Several exams.csv rows for one exam: the first won without a word, whatever the others said."""
    src = tmp_path / "c15"
    write_part(src, 0, [1, 2, 3], [TEN] * 3)
    write_exams_csv(
        src,
        [
            *(exam_row(e, 0) for e in (1, 2, 3)),
            exam_row(1, 0),  # exact repeats: one row
            exam_row(1, 0),
            exam_row(2, 0, age=71, AF=True),  # another age and label: which holds?
            exam_row(2, 0),
            exam_row(9, 0, age=40),  # part 0 does not hold exam 9, and part 5 is not here
            exam_row(9, 5, age=41),
            exam_row(8, 5, age=40),  # rows naming only a part that is not here: not downloaded
            exam_row(8, 6, age=41),
        ],
    )
    rc, out, err = run(capsys, "preprocess", "code15", "--src", src, "--out", tmp_path / "o")
    assert rc == 0 and "stored 2 + skipped 2 = found 4" in out, out + err
    assert "3 exams.csv rows repeat an earlier row of their exam exactly" in err
    assert [r["record_id"] for r in read_rows(tmp_path / "o" / "index.csv")] == ["1", "3"]
    assert [(r["record_id"], r["reason"], r["detail"]) for r in read_rows(tmp_path / "o" / "skipped.csv")] == [
        ("2", "duplicate_exam_rows", "exams.csv has 3 rows for exam 2 that disagree on age, AF"),
        ("9", "duplicate_exam_rows", "exams.csv has 2 rows for exam 9 that disagree on age, trace_file"),
    ]
    counts = json.loads((tmp_path / "o" / "preprocess.json").read_text())["counts"]
    assert counts["repeated_exam_rows"] == 3 and counts["skipped_by_reason"] == {"duplicate_exam_rows": 2}


# --- generated CODE-15 tables and parts that disagree -------------------------------------------

part_spec = st.tuples(
    st.booleans(),  # readable
    st.lists(st.integers(1, 4), max_size=3),  # exam ids of its rows (before the exam_id 0 padding row)
)


# exams.csv rows of one exam: (part its trace_file names, age); equal tuples are identical rows
exam_rows = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([50, 61])), min_size=1, max_size=3)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parts=st.lists(part_spec, min_size=1, max_size=3),
    placed=st.dictionaries(st.integers(1, 4), exam_rows, max_size=4),  # exams.csv: exam -> its rows
)
@example(parts=[(False, []), (True, [2])], placed={2: [(0, 50)]})  # exams.csv places exam 2 in the unreadable part
@example(parts=[(True, [1, 2])], placed={1: [(0, 50), (0, 50)], 2: [(0, 50), (0, 61)]})  # repeated, disagreeing
@example(parts=[(False, []), (True, [])], placed={3: [(2, 50), (0, 61), (1, 50)]})  # rows name three parts
def test_generated_code15_sets_account_for_every_exam_once(parts, placed):
    """Each exam a readable part holds or an exams.csv row places in a present part is in index.csv or
    skipped.csv; beyond its first appearance only as duplicate_record rows; nothing else is. An exam
    whose rows disagree is skipped as duplicate_exam_rows; rows repeated exactly are counted, once."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        held, present = [], set()
        for k, (readable, ids) in enumerate(parts):
            present.add(k)
            if readable:
                write_part(src, k, ids, [TEN] * len(ids))
                held += ids
            else:
                (src / f"exams_part{k}.hdf5").write_bytes(b"\x89HDF\r\n" + bytes(64))
        # every exam's first row, then every second row, ...: an exam's rows are not side by side
        rows = [(i, e, k, age) for e, exam in sorted(placed.items()) for i, (k, age) in enumerate(exam)]
        write_exams_csv(src, [exam_row(e, k, age=age) for _, e, k, age in sorted(rows)])
        rc = main(["preprocess", "code15", "--src", str(src), "--out", str(Path(tmp) / "o")])
        placed_here = {str(e) for e, exam in placed.items() if any(k in present for k, _ in exam)}
        if not held and not placed_here and all(r for r, _ in parts):
            assert rc == 2  # nothing at all to account for
            return
        assert rc == 0
        stored, skipped = _outcome(Path(tmp) / "o")
        expected = {str(e) for e in held} | placed_here
        unreadable_parts = {f"exams_part{k}.hdf5" for k, (r, _) in enumerate(parts) if not r}
        first = Counter(stored + [i for i, reason in skipped if reason != "duplicate_record"])
        assert set(first) - unreadable_parts == expected and set(first.values()) == {1}, (stored, skipped)
        repeats = Counter(map(str, held)) - Counter(set(map(str, held)))
        assert Counter(i for i, reason in skipped if reason == "duplicate_record") == repeats
        disagree = {str(e) for e, exam in placed.items() if len(set(exam)) > 1}
        assert {i for i, reason in skipped if reason == "duplicate_exam_rows"} == disagree & expected
        repeated = sum(len(exam) - len(set(exam)) for exam in placed.values())
        counts = json.loads((Path(tmp) / "o" / "preprocess.json").read_text())["counts"]
        assert counts.get("repeated_exam_rows", 0) == repeated
