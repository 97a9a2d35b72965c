"""Every input record appears exactly once in index.csv or skipped.csv, and stored samples are the
record's own: CODE-15 tables and parts that disagree, headers of other records, unlistable folders.

Each case drives `ecgpos preprocess` on copies of the real samples or on CODE-15 files in the
published layout, and checks the rows that account for every record.
"""

from __future__ import annotations

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
from refusal_helpers import ROOT, read_rows, run, unprivileged

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


def test_a_folder_that_cannot_be_listed_is_a_counted_skip(tmp_path, shared_data):
    """os.walk left an unreadable folder out without a word: its records vanished from the count."""
    real = shared_data / "ecg-arrhythmia" / "WFDBRecords"
    src = tmp_path / "src"
    shutil.copytree(real / "01" / "010", src / "WFDBRecords" / "01" / "010")
    shutil.copytree(real / "02" / "020", src / "WFDBRecords" / "02" / "020")
    (src / "WFDBRecords" / "02").chmod(0)
    script = (
        "import sys; from ecgpos.cli import main\n"
        "for src, out in ((sys.argv[1], sys.argv[2]), (sys.argv[1] + '/WFDBRecords/02', sys.argv[3])):\n"
        "    print('rc', main(['preprocess', 'ecg-arrhythmia', '--subset', 'all', '--src', src, '--out', out]))\n"
    )
    try:
        proc = subprocess.run(
            [*unprivileged(), sys.executable, "-c", script, src, tmp_path / "o", tmp_path / "o2"],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=300,
        )
    finally:
        (src / "WFDBRecords" / "02").chmod(0o755)
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
    assert errors == [f"ecgpos preprocess: error: --src {src}/WFDBRecords/02 cannot be listed: Permission denied"]


# --- generated CODE-15 tables and parts that disagree -------------------------------------------

part_spec = st.tuples(
    st.booleans(),  # readable
    st.lists(st.integers(1, 4), max_size=3),  # exam ids of its rows (before the exam_id 0 padding row)
)


@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    parts=st.lists(part_spec, min_size=1, max_size=3),
    placed=st.dictionaries(st.integers(1, 4), st.integers(0, 2), max_size=4),  # exams.csv: exam -> part
)
@example(parts=[(False, []), (True, [2])], placed={2: 0})  # exams.csv places exam 2 in the unreadable part
def test_generated_code15_sets_account_for_every_exam_once(parts, placed):
    """Each exam a readable part holds or exams.csv places in a present part is in index.csv or
    skipped.csv; beyond its first appearance only as duplicate_record rows; nothing else is."""
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
        write_exams_csv(src, [exam_row(e, k) for e, k in sorted(placed.items())])
        rc = main(["preprocess", "code15", "--src", str(src), "--out", str(Path(tmp) / "o")])
        if not held and not any(k in present for k in placed.values()) and all(r for r, _ in parts):
            assert rc == 2  # nothing at all to account for
            return
        assert rc == 0
        stored, skipped = _outcome(Path(tmp) / "o")
        expected = {str(e) for e in held} | {str(e) for e, k in placed.items() if k in present}
        unreadable_parts = {f"exams_part{k}.hdf5" for k, (r, _) in enumerate(parts) if not r}
        first = Counter(stored + [i for i, reason in skipped if reason != "duplicate_record"])
        assert set(first) - unreadable_parts == expected and set(first.values()) == {1}, (stored, skipped)
        repeats = Counter(map(str, held)) - Counter(set(map(str, held)))
        assert Counter(i for i, reason in skipped if reason == "duplicate_record") == repeats
