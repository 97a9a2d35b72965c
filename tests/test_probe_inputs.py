"""Odd inputs to `ecgpos probe` and `ecgpos geometry` that must give one line, never a plausible table (or a
traceback): one record under two spellings, two task folders of one name, a repeated header column,
repeated or out-of-range label fractions, a row label shared with a baseline, a malformed --reference,
and a validation split that selects nothing. Custom tasks over real PTB-XL records, a random-init
tiny encoder; most refusals come before any feature is extracted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import one_line_error, run

from ecgpos.errors import EcgposError
from ecgpos.probes.geometry.cli import select_records
from ecgpos.probes.linear.run import Job, run_job
from ecgpos.probes.linear.train import ProtocolConfig
from ecgpos.probes.shared.datasets import RecordLocator
from ecgpos.probes.shared.published import read_reference
from ecgpos.probes.shared.tasks import SPLITS

PTBXL = "ptbxl/records500/00000"
ENCODER = "random:tiny/level0"
QUICK = ["--seeds", "1", "--epochs", "1", "--bootstrap", "0", "--device", "cpu"]


def _task(folder: Path, shared_data: Path, first: int = 1, edit=None, header: str = "record,A,B") -> Path:
    """A custom task over real PTB-XL records first..first+15 (train 8, val 4, test 4), A/B alternating;
    `edit(split, rows)` may change the row texts."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, offsets in (("train", range(0, 8)), ("val", range(8, 12)), ("test", range(12, 16))):
        numbers = [first + k for k in offsets]
        rows = [f"{shared_data / PTBXL / f'{n:05d}_hr'},{n % 2},{1 - n % 2}" for n in numbers]
        rows = edit(split, rows) if edit else rows
        (folder / f"{split}.csv").write_text("\n".join([header, *rows]) + "\n")
    return folder


def _probe(capsys, tmp_path: Path, task: str, *extra: object) -> tuple[int, str, str]:
    args = ["probe", "--encoder", ENCODER, "--task", task, "--out", tmp_path / "out"]
    fractions = [] if any("fractions" in str(e) for e in extra) else ["--fractions", "100"]
    return run(capsys, *args, "--cache-dir", tmp_path / "cache", *QUICK, *fractions, *extra)


@pytest.mark.parametrize("spelling", ["{}.hea", "{}/../00000/{}", "link/{}"])
def test_one_record_in_train_and_test_under_another_spelling_is_refused(capsys, tmp_path, shared_data, spelling):
    """Splits were compared by key as written: `r.hea`, `dir/../dir/r` or a path through a link to a
    training record put it in the test split too, and the probe tested on what it trained on."""
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "link").symlink_to(shared_data / PTBXL)
    record = str(shared_data / PTBXL / "00001_hr")
    other = {
        "{}.hea": f"{record}.hea",
        "{}/../00000/{}": f"{shared_data / PTBXL}/../00000/00001_hr",
        "link/{}": "link/00001_hr",
    }[spelling]

    def leak(split: str, rows: list[str]) -> list[str]:
        return rows if split != "test" else [f"{other},1,0", *rows[1:]]

    _task(folder, shared_data, edit=leak)
    rc, _, err = _probe(capsys, tmp_path, f"custom:{folder}")
    one_line_error(rc, err, "probe", "(train) are the same record")
    assert not (tmp_path / "out").exists()


def test_geometry_counts_a_record_listed_in_two_splits_under_two_spellings_once(tmp_path, shared_data):
    """geometry counted a record once per key: as `r` and `r.hea` it was measured twice, here as A and X."""
    record = shared_data / PTBXL / "00001_hr"
    folder = _task(
        tmp_path / "task",
        shared_data,
        header="record,A,B,X",
        edit=lambda split, rows: [r + ",0" for r in rows] + ([f"{record}.hea,0,0,1"] if split == "test" else []),
    )
    sel, _ = select_records(f"custom:{folder}", None, tmp_path, SPLITS, ["A", "B"], ["X"])
    assert len(sel.keys) == 16 and "X" not in sel.labels


def test_split_keys_leading_out_of_the_dataset_folder_are_not_under_the_data_root(shared_data):
    """An absolute path or `..` in a PTB-XL or CSN split key read a record from anywhere, recorded as
    read from --data-root."""
    ptbxl = RecordLocator("ptbxl", shared_data)
    assert ptbxl.locate("records500/00000/00001_hr") is not None
    assert ptbxl.locate(str(shared_data / "ptbxl" / "records500" / "00000" / "00001_hr")) is None
    assert ptbxl.locate("../ptbxl/records500/00000/00001_hr") is None
    csn = RecordLocator("csn", shared_data)
    assert csn.locate("/chapman/WFDBRecords/01/010/JS00001.mat") is not None
    assert csn.locate("/chapman/../ecg-arrhythmia/WFDBRecords/01/010/JS00001.mat") is None


def test_two_task_folders_of_one_name_are_refused(capsys, tmp_path, shared_data):
    """custom:a/task and custom:b/task are both `custom:task`: their rows were merged into one cell."""
    one = _task(tmp_path / "a" / "task", shared_data)
    two = _task(tmp_path / "b" / "task", shared_data, first=21)
    rc, _, err = _probe(capsys, tmp_path, f"custom:{one},custom:{two}")
    one_line_error(rc, err, "probe", "are both task custom:task; rename one folder")


@pytest.mark.parametrize("header, needle", [("record,A,A,B", "column(s) A appear"), ("record,,B", "has no name")])
def test_a_repeated_or_blank_class_header_is_refused(capsys, tmp_path, shared_data, header, needle):
    """pandas renames a repeated column to A.1 and a blank one to `Unnamed: 1`: each became a class."""
    extra = ",0" if header.count(",") == 3 else ""
    folder = _task(tmp_path / "task", shared_data, header=header, edit=lambda s, rows: [r + extra for r in rows])
    rc, _, err = _probe(capsys, tmp_path, f"custom:{folder}")
    one_line_error(rc, err, "probe", needle)


@pytest.mark.parametrize(
    "flags",
    [
        ["--fractions", "10,10"],  # each row twice, read as two seeds
        ["--fractions", "100,100.0"],
        ["--set", "fractions=[2.0]"],  # all rows, tabled as "200%"
        ["--set", "fractions=[1, 10, 100]"],  # percentages where fractions belong: "1000%"
        ["--set", "fractions=[0]"],  # a table of NaN rows
        ["--set", "fractions=[-1]"],  # scikit-learn traceback
        ["--set", "fractions=[]"],  # matplotlib traceback
    ],
)
def test_repeated_or_out_of_range_label_fractions_are_one_line(capsys, tmp_path, shared_data, flags):
    folder = _task(tmp_path / "task", shared_data)
    rc, _, err = _probe(capsys, tmp_path, f"custom:{folder}", *flags)
    one_line_error(rc, err, "probe", "label fractions must be distinct numbers in (0, 1]")


def test_a_task_list_naming_no_task_is_one_line(capsys, tmp_path):
    """`--task ,` probed nothing and died drawing an empty chart."""
    rc, _, err = _probe(capsys, tmp_path, ",")
    one_line_error(rc, err, "probe", "names no task")


def test_geometry_task_naming_several_tasks_is_one_line(capsys, tmp_path, shared_data):
    """geometry takes one task: `all` or a list raised KeyError."""
    args = ["geometry", "--encoder", tmp_path, "--task", "all", "--data-root", shared_data]
    rc, _, err = run(capsys, *args, "--nominal", "NORM,MI", "--anomalous", "CD", "--out", tmp_path / "g")
    one_line_error(rc, err, "geometry", "unknown task 'all'")


def test_an_encoder_label_equal_to_a_baseline_label_is_refused(capsys, tmp_path, shared_data):
    """--name "raw signal" with --raw-baseline: both rows under one label were trained as one layer
    on the encoder's features and tabled as one encoder."""
    folder = _task(tmp_path / "task", shared_data)
    rc, _, err = _probe(capsys, tmp_path, f"custom:{folder}", "--name", "raw signal", "--raw-baseline")
    one_line_error(rc, err, "probe", "row label 'raw signal' is also a baseline's")


def test_a_wrong_reference_is_refused_before_probing(capsys, tmp_path, shared_data):
    """--reference was read after training: the error came after results.csv had been written."""
    folder = _task(tmp_path / "task", shared_data)
    rc, _, err = _probe(capsys, tmp_path, f"custom:{folder}", "--reference", "papers")
    one_line_error(rc, err, "probe", "--reference papers")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, needle",
    [
        ("model,ptbxl-super\nX,0.9O\n", "not numbers"),  # ValueError traceback
        ("model,ptbxl-super\nX,0.8\nX,0.9\n", "X listed more than once"),  # TypeError traceback
        ("model,ptbxl-super\n", "no published rows"),  # IndexError traceback
    ],
)
def test_malformed_reference_tables_are_one_line(tmp_path, text, needle):
    path = tmp_path / "ref.csv"
    path.write_text(text)
    with pytest.raises(EcgposError, match=needle):
        read_reference(str(path))


def test_a_validation_split_that_scores_no_class_is_noted():
    """Without a scorable val class no epoch is selected: the first epoch's test AUROC was tabled like
    any selected one, with only the excluded val classes listed."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 4)).astype(np.float32)
    y = np.stack([np.arange(24) % 2, 1 - np.arange(24) % 2], 1).astype(np.uint8)
    y_val = np.zeros((8, 2), np.uint8)  # no positive: no AUROC in val
    arrays = (x[:16], y[:16], x[16:], y_val, x[16:], y[16:])
    job = Job("enc", ["t"], [["A", "B"]], 1.0, arrays, [0], ProtocolConfig(epochs=2))
    (row,) = run_job(job)
    assert np.isnan(row["val_auroc"]) and np.isfinite(row["test_auroc"])
    assert "no val class has positives and negatives: epoch 1 reported, no selection" in row["note"]


def test_compare_flags_custom_tasks_of_one_name_read_from_two_folders(capsys, tmp_path, shared_data):
    """A custom task is named by its folder's name alone; two folders of one name (other records, the
    same relative keys) were merged into one column and paired record by record without a word."""
    folders = []
    for name, first, task_name in (("a", 1, "task"), ("b", 21, "task"), ("c", 41, "other")):
        task = _task(tmp_path / name / task_name, shared_data, first=first)
        folders.append(tmp_path / f"out-{name}")
        args = ["probe", "--encoder", ENCODER, "--task", f"custom:{task}", "--name", name, "--out", folders[-1]]
        assert run(capsys, *args, "--cache-dir", tmp_path / "cache", *QUICK, "--fractions", "100")[0] == 0
    rc, out, _ = run(capsys, "probe", "--compare", *folders)
    assert rc == 0
    assert f"**folder of custom:task**: out-a: {tmp_path / 'a' / 'task'}; out-b: {tmp_path / 'b' / 'task'}" in out
    # a folder that did not probe a task says nothing about that task's folder
    assert "folder of custom:other" not in out
    rc, out, _ = run(capsys, "probe", "--compare", folders[0], folders[2])
    assert rc == 0 and "folder of" not in out
