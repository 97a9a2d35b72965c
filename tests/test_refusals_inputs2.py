"""What ecgpos refuses or reports at its edges (continued): odd corpus trees, CODE-15 tables that
disagree with their parts, files where folders belong, impossible spec values, probe splits that
share records.

Each bad input was once a traceback, a miscount or a silently wrong result; each test drives the
CLI in-process and checks the one stderr line (exit 2) or the skipped.csv row that accounts for it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
from code15_fixtures import FS as CODE15_FS
from code15_fixtures import ecg_like, exam_row, padded_trace, write_exams_csv, write_part
from refusal_helpers import FAST, PRETRAIN, TINY0, copy_record, one_line_error, read_rows, run


def _tree(real: Path, root: Path, ids: list[str], listed: list[str]) -> Path:
    """A WFDBRecords/01/010 bucket holding copies of the real record under `ids`, and a RECORDS file."""
    bucket = root / "WFDBRecords" / "01" / "010"
    bucket.mkdir(parents=True)
    for record_id in ids:
        header = real.with_suffix(".hea").read_bytes().replace(real.name.encode(), record_id.encode())
        (bucket / f"{record_id}.hea").write_bytes(header)
        shutil.copyfile(real.with_suffix(".mat"), bucket / f"{record_id}.mat")
    (bucket / "RECORDS").write_text("".join(f"{name}\n" for name in listed))
    return bucket


def _preprocess(capsys, src: Path, out: Path, dataset: str = "ecg-arrhythmia") -> tuple[int, str, str]:
    extra = ["--subset", "all"] if dataset == "ecg-arrhythmia" else []
    return run(capsys, "preprocess", dataset, "--src", src, "--out", out, *extra)


def test_symlink_loop_in_the_tree_counts_each_record_once(capsys, tmp_path, real_record):
    """A link back up the tree listed every record again at each level until the OS gave up:
    one record was "found" 41 times, 40 of them as duplicate_record."""
    bucket = _tree(real_record, tmp_path / "src", ["JS00001"], ["JS00001"])
    (bucket / "again").symlink_to("..")
    rc, out, err = _preprocess(capsys, tmp_path / "src", tmp_path / "o")
    assert rc == 0 and "stored 1 + skipped 0 = found 1" in out, out + err
    # a symlinked folder elsewhere (a tree assembled from links) is still followed
    linked = tmp_path / "linked" / "WFDBRecords"
    linked.mkdir(parents=True)
    (linked / "01").symlink_to(tmp_path / "src" / "WFDBRecords" / "01")
    rc, out, err = _preprocess(capsys, tmp_path / "linked", tmp_path / "o2")
    assert rc == 0 and "stored 1 + skipped 0 = found 1" in out, out + err


def test_records_listed_in_RECORDS_but_absent_are_skipped(capsys, tmp_path, real_record):
    """A partial copy (a record of RECORDS with no file) was silently left out of the count."""
    _tree(real_record, tmp_path / "src", ["JS00001", "JS00004"], ["JS00001", "JS00002", "JS00004"])
    rc, out, err = _preprocess(capsys, tmp_path / "src", tmp_path / "o")
    assert rc == 0 and "stored 2 + skipped 1 = found 3" in out, out + err
    (row,) = read_rows(tmp_path / "o" / "skipped.csv")
    assert (row["record_id"], row["reason"]) == ("JS00002", "unreadable")
    assert "listed in WFDBRecords/01/010/RECORDS" in row["detail"]


def _code15(src: Path, rows: list[dict]) -> None:
    ten = padded_trace(ecg_like(4000, CODE15_FS, 1))
    write_part(src, 0, [1, 2], [ten, ten])
    (src / "exams_part1.hdf5").write_bytes(b"not an HDF5 file" * 8)
    write_exams_csv(src, rows)


def test_code15_exams_missing_from_their_part_are_skipped(capsys, tmp_path):
    """exams.csv rows naming a part that is present but does not hold them were silently lost."""
    rows = [exam_row(1, 0), exam_row(2, 0), exam_row(3, 0), exam_row(7, 1), exam_row(9, 5)]  # part 5: not here
    _code15(tmp_path / "c15", rows)
    rc, out, err = _preprocess(capsys, tmp_path / "c15", tmp_path / "o", "code15")
    assert rc == 0 and "stored 2 + skipped 2 = found 4" in out, out + err
    reasons = {r["record_id"]: (r["reason"], r["detail"]) for r in read_rows(tmp_path / "o" / "skipped.csv")}
    assert reasons["3"] == ("unreadable", "exams.csv puts exam 3 in exams_part0.hdf5, which does not hold it")
    assert reasons["7"][0] == "unreadable_part"


def test_code15_row_without_an_exam_id_is_one_line(capsys, tmp_path):
    """A blank exam_id in exams.csv was a ValueError traceback when its part was unreadable (and
    an unmatched row otherwise)."""
    rows = [exam_row(1, 0), exam_row(2, 0), dict(exam_row(7, 1), exam_id="")]
    _code15(tmp_path / "c15", rows)
    rc, _, err = _preprocess(capsys, tmp_path / "c15", tmp_path / "o", "code15")
    one_line_error(rc, err, "preprocess", "exams.csv line 4: exam_id is blank")
    assert not (tmp_path / "o" / "index.csv").exists()


def test_code15_part_with_odd_exam_ids_or_integer_tracings_is_unreadable_part(capsys, tmp_path):
    """An (N, 1) exam_id was a TypeError traceback; fractional ids were truncated onto another
    exam's metadata, and integer tracings (ADC counts) were read as mV."""
    ten = padded_trace(ecg_like(4000, CODE15_FS, 1))
    traces = np.stack([ten, ten, np.zeros_like(ten)])
    cases = {
        "column": (np.array([[1], [2], [0]]), traces, "exam_id has shape (3, 1)"),
        "fraction": (np.array([1.5, 2.0, 0.0]), traces, "not whole numbers"),
        "counts": (np.array([1, 2, 0]), (traces * 1000).astype(np.int16), "tracings dtype int16"),
    }
    for name, (ids, tracings, needle) in cases.items():
        src = tmp_path / name
        src.mkdir()
        with h5py.File(src / "exams_part0.hdf5", "w") as f:
            f.create_dataset("exam_id", data=ids)
            f.create_dataset("tracings", data=tracings)
        write_exams_csv(src, [exam_row(1, 0), exam_row(2, 0)])
        rc, out, err = _preprocess(capsys, src, tmp_path / f"o-{name}", "code15")
        assert rc == 0 and "stored 0 + skipped 2 = found 2" in out, out + err
        rows = read_rows(tmp_path / f"o-{name}" / "skipped.csv")
        assert {r["reason"] for r in rows} == {"unreadable_part"} and needle in rows[0]["detail"]


def test_a_shard_file_given_as_the_shard_folder_says_so(capsys, tmp_path, tiny_shards):
    """`--shards shard-00000.h5` said the folder "does not exist" although the path exists."""
    shard = sorted(tiny_shards.glob("shard-*.h5"))[0]
    rc, _, err = run(capsys, *PRETRAIN, "--shards", shard, "--run-dir", tmp_path / "run", *FAST)
    one_line_error(rc, err, "pretrain", "is a file, not a folder")
    assert not (tmp_path / "run").exists()


def test_spec_units_other_than_mv_are_refused(capsys, tmp_path, real_record):
    """`--set units=uV` was stored in the spec (and the export card said "raw signal in uV") while
    every reader still converted the records to mV."""
    _tree(real_record, tmp_path / "src", ["JS00001"], ["JS00001"])
    rc, _, err = run(
        capsys,
        "preprocess",
        "ecg-arrhythmia",
        "--src",
        tmp_path / "src",
        "--out",
        tmp_path / "o",
        "--subset",
        "all",
        "--set",
        "units=uV",
    )
    one_line_error(rc, err, "preprocess", "preprocess.units must be 'mV'")
    assert not (tmp_path / "o").exists()
    rc, _, err = run(
        capsys, *PRETRAIN, "--shards", tmp_path, "--run-dir", tmp_path / "run", "--set", "preprocess.units=V"
    )
    one_line_error(rc, err, "pretrain", "preprocess.units must be 'mV'")


def _custom_task(folder: Path, train: list[str], val: list[str], test: list[str]) -> Path:
    """A custom probe task over one real record copied under several names (labels alternate 0/1)."""
    folder.mkdir(parents=True)
    for split, names in (("train", train), ("val", val), ("test", test)):
        lines = ["record,a,b"] + [f"{name},{i % 2},{1 - i % 2}" for i, name in enumerate(names)]
        (folder / f"{split}.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_probe_refuses_records_shared_between_splits(capsys, tmp_path, real_record):
    """A record in train and test (or twice in one split) was probed as given: a test score
    measured partly on training records, with no word about it."""
    for name in ("r1", "r2", "r3", "r4"):
        copy_record(real_record, tmp_path, name)
    cases = {
        "across": (["r1", "r2"], ["r3"], ["r4", "r1"], "record ../r1 is listed in both train and test"),
        "twice": (["r1", "r2"], ["r3", "r3"], ["r4"], "record ../r3 is listed twice in val"),
    }
    for case, (train, val, test, needle) in cases.items():
        task = _custom_task(
            tmp_path / case, [f"../{n}" for n in train], [f"../{n}" for n in val], [f"../{n}" for n in test]
        )
        args = ["probe", "--encoder", f"random:{TINY0}", "--task", f"custom:{task}", "--out", tmp_path / f"p-{case}"]
        rc, _, err = run(capsys, *args, "--cache-dir", tmp_path / "cache")
        one_line_error(rc, err, "probe", needle)
        assert not (tmp_path / f"p-{case}").exists()


def test_probe_splits_without_shared_records_still_run(tmp_path, real_record):
    """The split check reads the same files as the probe: disjoint splits pass it unchanged."""
    from ecgpos.probes.shared.tasks import read_splits, resolve_task

    task = resolve_task(f"custom:{_custom_task(tmp_path / 't', ['../r1', '../r2'], ['../r3'], ['../r4'])}")
    tables = read_splits(task, None)
    assert [t.records for t in tables.values()] == [["../r1", "../r2"], ["../r3"], ["../r4"]]
    assert np.array_equal(tables["train"].labels, [[0, 1], [1, 0]])


def test_small_custom_task_reports_empty_label_fractions(capsys, tmp_path, real_record):
    """1 % of a 4-record training split is no record: sklearn's ValueError was a traceback; the
    fraction's rows now say "no train rows" and the full-label probe still runs."""
    for i in range(1, 9):
        copy_record(real_record, tmp_path, f"r{i}")
    task = _custom_task(tmp_path / "t", ["../r1", "../r2", "../r5", "../r6"], ["../r3", "../r7"], ["../r4", "../r8"])
    args = ["probe", "--encoder", f"random:{TINY0}", "--task", f"custom:{task}", "--out", tmp_path / "p"]
    rc, _, err = run(
        capsys, *args, "--cache-dir", tmp_path / "cache", "--epochs", "2", "--seeds", "1", "--bootstrap", "0"
    )
    assert rc == 0 and "Traceback" not in err, err
    rows = {r["fraction"]: r for r in read_rows(tmp_path / "p" / "results.csv")}
    assert [rows[f]["note"] for f in ("0.01", "0.1")] == ["no train rows", "no train rows"]
    assert rows["1.0"]["n_train"] == "4" and rows["1.0"]["test_auroc"] != ""


def test_an_output_folder_that_is_a_file_is_one_line(capsys, tmp_path, shared_data, tiny_shards, tiny_run):
    """probe, probe --compare, geometry, pretrain, export and demo given a file as (or above) their
    output folder were FileExistsError / NotADirectoryError tracebacks; geometry's came after all
    its work."""
    bucket = shared_data / "ecg-arrhythmia" / "WFDBRecords" / "01" / "010"
    records = [str(bucket / f"JS0000{i}") for i in (1, 2, 4, 5, 6, 7)]
    task = tmp_path / "task"
    task.mkdir()
    for split in ("train", "val", "test"):
        rows = [f"{r},{int(i // 2 == 0)},{int(i // 2 == 1)},{int(i // 2 == 2)}" for i, r in enumerate(records)]
        (task / f"{split}.csv").write_text("\n".join(["record,a,b,c", *rows]) + "\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    level1 = f"random:{TINY0.parent / 'level1.yaml'}"
    geometry = ["geometry", "--encoder", level1, "--task", f"custom:{task}", "--nominal", "a,b", "--anomalous", "c"]
    commands = {
        "probe": ["probe", "--encoder", f"random:{TINY0}", "--task", f"custom:{task}", "--epochs", "1", "--seeds", "1"],
        "geometry": [*geometry, "--split", "test", "--device", "cpu"],
        "pretrain": [*PRETRAIN, "--shards", tiny_shards, *FAST],
    }
    for out in (blocker, blocker / "sub"):
        for command, args in commands.items():
            flag = "--run-dir" if command == "pretrain" else "--out"
            rc, _, err = run(capsys, *args, flag, out)
            one_line_error(rc, err, command, "is a file, not a folder")
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.csv").write_text("encoder,task,fraction,seed,test_auroc\nx,custom:t,1.0,0,0.6\n")
    rc, _, err = run(capsys, "probe", "--compare", results, "--out", blocker / "sub")
    one_line_error(rc, err, "probe", "is a file, not a folder")
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", blocker / "sub")
    one_line_error(rc, err, "export", "is a file, not a folder")
    rc, _, err = run(capsys, "demo", "--quick", "--out", blocker)
    one_line_error(rc, err, "demo", "is a file, not a folder")
    assert blocker.read_text() == "x"
