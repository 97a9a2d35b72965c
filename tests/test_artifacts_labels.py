"""`score --labels` names every labelled record its AUROC leaves out and needs two records of each
class; label CSVs with a byte-order mark are read, blank fields refused; a window under one second is
refused before preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from refusal_helpers import one_line_error, run

from ecgpos.ecg.wfdb_io import read_wfdb_record


@pytest.fixture(scope="module")
def records(real_record, tmp_path_factory) -> tuple[Path, str]:
    """A .npy of five shifted copies of a real record (ids 0-4), record 4 holding NaN; its lead names."""
    raw = read_wfdb_record(real_record)
    rows = np.stack([np.roll(raw.signal, 250 * k, axis=1) for k in range(5)])
    rows[4, 0, :10] = np.nan
    path = tmp_path_factory.mktemp("labelled") / "x.npy"
    np.save(path, rows)
    return path, ",".join(raw.leads)


def _score(capsys, tiny_run, records, labels: Path, out: Path):
    path, leads = records
    return run(capsys, "score", "--run", tiny_run, "--input", path, "--fs", 500, "--leads", leads, "--masks", 1,
               "--out", out, "--labels", labels, "--nominal", "N", "--anomalous", "A", "--no-progress")  # fmt: skip


def test_labelled_records_left_out_of_the_auroc_are_named(tiny_run, records, tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text("\ufeffrecord_id,label\n0,N\n1,N\n2,A\n3,A\n4,A\nghost,N\n")  # BOM: as a spreadsheet saves it
    rc, out, err = _score(capsys, tiny_run, records, labels, tmp_path / "s.csv")
    assert rc == 0, err
    assert "1 labelled record(s)" in err and "4 (non_finite)" in err
    assert "1 labelled id(s)" in err and "ghost" in err
    summary = (tmp_path / "s.summary.md").read_text()
    assert "4 (non_finite)" in summary and "ghost" in summary


def test_a_class_of_one_record_is_refused(tiny_run, records, tmp_path, capsys):
    labels = tmp_path / "labels.csv"
    labels.write_text("record_id,label\n0,N\n2,A\n3,A\n")
    rc, _, err = _score(capsys, tiny_run, records, labels, tmp_path / "s.csv")
    one_line_error(rc, "\n".join(line for line in err.splitlines() if "skipped 4" not in line), "score", "at least 2")
    assert not (tmp_path / "s.summary.md").exists()


@pytest.mark.parametrize("row, blank", [(",N", "record_id"), ("3,", "label"), ("3", "label")])
def test_blank_label_fields_are_refused_before_scoring(tiny_run, records, tmp_path, capsys, row, blank):
    labels = tmp_path / "labels.csv"
    labels.write_text(f"record_id,label\n0,N\n1,N\n2,A\n{row}\n")
    rc, _, err = _score(capsys, tiny_run, records, labels, tmp_path / "s.csv")
    one_line_error(rc, err, "score", f"line 5: blank {blank}")
    assert not (tmp_path / "s.csv").exists()


def test_preprocess_refuses_a_window_under_one_second(shared_data, tmp_path, capsys):
    src = shared_data / "ecg-arrhythmia"
    rc, _, err = run(capsys, "preprocess", "ecg-arrhythmia", "--src", src, "--out", tmp_path / "s", "--set", "window=1")
    one_line_error(rc, err, "preprocess", "preprocess.window must hold at least one second")
    assert not list((tmp_path / "s").glob("shard-*")) if (tmp_path / "s").exists() else True
