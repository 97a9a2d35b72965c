"""`ecgpos probe` end to end on the sample data: every paper task with the raw baseline, its outputs, and a
second run served from the feature cache with the same results."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from refusal_helpers import TINY0, run


@pytest.mark.skipif(not TINY0.is_file(), reason="configs/tiny/level0.yaml not written yet")
def test_done_when_run_on_sample_data(capsys, shared_data, tmp_path):
    args = [
        "--encoder",
        f"random:{TINY0}",
        "--task",
        "all",
        "--data-root",
        shared_data,
        "--splits",
        shared_data / "merl_splits",
        "--fractions",
        "100",
        "--seeds",
        "2",
        "--epochs",
        "3",
        "--workers",
        "1",
        "--cache-dir",
        tmp_path / "cache",
        "--out",
        tmp_path / "out",
        "--raw-baseline",
    ]
    rc, out, err = run(capsys, "probe", *args)
    assert rc == 0, err
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(results) == 2 * 5 * 2  # (encoder + raw) x tasks x seeds
    assert set(results["task"]) == {"ptbxl-super", "ptbxl-sub", "ptbxl-form", "ptbxl-rhythm", "cpsc2018"}
    assert (results[results["task"] == "ptbxl-super"]["n_train"] == 124).all()
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| Encoder | Super | Sub | Form | Rhythm | CPSC2018 |" in summary
    assert "- Raw-signal baseline: the centre window only, on every dataset" in summary  # CPSC2018 rows pool 4
    # no pretraining index (a random encoder): the summary says what the guard did not check
    assert "## Pretraining overlap (leakage guard)\n\nNot run: the encoder records no pretraining shards" in summary
    assert "leakage guard: not run (" in out
    # PTB-XL's test patients with several recordings: resampled as patients there; CPSC2018 names one each
    units = results.groupby("task")["bootstrap_unit"].agg(set).to_dict()
    assert units["cpsc2018"] == {"record"} and units["ptbxl-super"] == {"patient"}
    assert "| Encoder | Super |" in out
    assert (tmp_path / "out" / "summary.png").is_file()
    info = json.loads((tmp_path / "out" / "probe.json").read_text())
    assert sum(v["extracted"] for v in info["extraction"].values()) > 0
    rc, _, err = run(capsys, "probe", *args[:-2], tmp_path / "again", "--raw-baseline")
    assert rc == 0, err
    again = json.loads((tmp_path / "again" / "probe.json").read_text())
    assert sum(v["extracted"] for v in again["extraction"].values()) == 0
    pd.testing.assert_frame_equal(results, pd.read_csv(tmp_path / "again" / "results.csv"))
