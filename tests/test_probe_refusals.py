"""`ecgpos probe` refuses, in one line, an unknown task, split files that are missing, mislabelled or
share a patient across splits, an encoder it cannot load, and missing records under --require-complete."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
from refusal_helpers import TINY0, one_line_error, run

from ecgpos.probes.shared.tasks import resolve_task


def _probe_task(capsys, encoder, task: str, data_root: Path, splits: Path, out: Path, *extra) -> tuple[int, str, str]:
    """`ecgpos probe` on one task: exit code, stdout, stderr."""
    args = ("--encoder", encoder, "--task", task, "--data-root", data_root, "--splits", splits, "--out", out)
    return run(capsys, "probe", *args, *extra)


def test_unknown_task_is_one_line(capsys, shared_data, tmp_path):
    rc, _, err = _probe_task(
        capsys, f"random:{TINY0}", "ptbxl-diagnostic", shared_data, shared_data / "merl_splits", tmp_path
    )
    one_line_error(rc, err, "probe", "unknown task 'ptbxl-diagnostic'")


def test_splits_folder_without_files_is_one_line(capsys, shared_data, tmp_path):
    rc, _, err = _probe_task(capsys, f"random:{TINY0}", "cpsc2018", shared_data, tmp_path, tmp_path / "out")
    one_line_error(rc, err, "probe", "icbeb/icbeb_train.csv not found")


def test_class_column_mismatch_is_one_line(capsys, shared_data, tmp_path):
    shutil.copytree(shared_data / "merl_splits" / "icbeb", tmp_path / "icbeb")
    frame = pd.read_csv(tmp_path / "icbeb" / "icbeb_val.csv").rename(columns={"STD": "STDX"})
    frame.to_csv(tmp_path / "icbeb" / "icbeb_val.csv", index=False)
    rc, _, err = _probe_task(capsys, f"random:{TINY0}", "cpsc2018", shared_data, tmp_path, tmp_path / "out")
    one_line_error(rc, err, "probe", "missing STD; unexpected STDX")


def test_merl_splits_share_no_patient_and_a_shared_patient_is_one_line(capsys, shared_data, tmp_path):
    """PTB-XL's folds are drawn by patient; a val or test recording of a training patient was probed."""
    from ecgpos.probes.shared.tasks import read_splits

    for name in ("ptbxl-super", "ptbxl-sub", "ptbxl-form", "ptbxl-rhythm", "cpsc2018"):
        tables = read_splits(resolve_task(name), shared_data / "merl_splits")  # MERL's files as published
        frames = {s: pd.read_csv(t.path, usecols=["patient_id"]) for s, t in tables.items()}
        ids = {s: set(f["patient_id"]) for s, f in frames.items()}
        assert not (ids["train"] & ids["val"] or ids["train"] & ids["test"] or ids["val"] & ids["test"]), name
    folder = tmp_path / "ptbxl" / "super_class"
    shutil.copytree(shared_data / "merl_splits" / "ptbxl" / "super_class", folder)
    train = pd.read_csv(folder / "ptbxl_super_class_train.csv")
    test = pd.read_csv(folder / "ptbxl_super_class_test.csv")
    test.loc[5, "patient_id"] = train.loc[0, "patient_id"]  # another recording of a training patient
    test.to_csv(folder / "ptbxl_super_class_test.csv", index=False)
    rc, _, err = _probe_task(capsys, f"random:{TINY0}", "ptbxl-super", shared_data, tmp_path, tmp_path / "out")
    one_line_error(rc, err, "probe", f"patient {train.loc[0, 'patient_id']} has records in both train and test")


def test_unloadable_encoder_is_one_line(capsys, shared_data, tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("not: a run\n")
    rc, _, err = _probe_task(
        capsys, tmp_path / "run", "cpsc2018", shared_data, shared_data / "merl_splits", tmp_path / "out"
    )
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_require_complete_refuses_missing_records(capsys, shared_data, tmp_path):
    rc, _, err = _probe_task(
        capsys, f"random:{TINY0}", "cpsc2018", shared_data, shared_data / "merl_splits", tmp_path, "--require-complete"
    )
    one_line_error(rc, err, "probe", "cpsc2018 train: 4931 of 4950 records not found")
