"""`ecgpos carve --decide`: the decision after one level of runs trained elsewhere (slurm/decide.sbatch), on
the same measurement, stop rules and carve.* record as the depth loop itself."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_runs import cli, pretrain_tiny

from ecgpos.pretrain.carve_plan import CONTINUE, STOP_BELOW, STOP_MAX, read_carve

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]


@pytest.mark.slow
def test_decide_measures_the_pipelines_runs_and_keeps_measurements_for_a_resumed_chain(
    arrhythmia_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "runs"
    held = ["--set", "train.val_fraction=0.1"]
    pretrain_tiny(0, arrhythmia_shards, runs / "level0", *FAST, *held)
    decide = ["carve", "--shards", arrhythmia_shards, "--run-dir", runs]
    carve_on = ["--max-levels", "3", "--stop-below", "0", "--min-drop", "-1"]

    # level 1 is not trained yet: one line naming its folder
    assert cli(*decide, *carve_on, "--decide", "1") == 2
    assert f"{runs / 'level1'} is not a finished run" in capsys.readouterr().err
    # the criterion is measured on the records the runs held out: another fraction is refused
    assert cli(*decide, *carve_on, "--decide", "0", "--val-fraction", "0.2") == 2
    assert "train.val_fraction=0.1, not --val-fraction 0.2" in capsys.readouterr().err

    assert cli(*decide, *carve_on, "--decide", "0") == 0
    pretrain_tiny(1, arrhythmia_shards, runs / "level1", *FAST, *held, base=runs / "level0")
    assert cli(*decide, *carve_on, "--decide", "1") == 0
    levels = json.loads((runs / "carve.json").read_text())["levels"]
    assert [(r["level"], r["run_dir"], r["decision"]["rule"]) for r in levels] == [
        (0, str(runs / "level0"), CONTINUE),
        (1, str(runs / "level1"), CONTINUE),
    ]
    assert all(r["records"] == 22 and r["steps"] == 2 for r in levels)
    assert "Decision after level 1: carving on, criterion" in (runs / "carve.md").read_text()

    # a resumed chain decides level 0 again: level 1's measurement is kept for its decide job, not shown
    assert cli(*decide, *carve_on, "--decide", "0") == 0
    data = json.loads((runs / "carve.json").read_text())
    assert [r["level"] for r in data["levels"]] == [0] and data["measured_above"] == [levels[1]]
    assert "| 1 |" not in (runs / "carve.md").read_text()
    assert read_carve(runs)[1] == [data["levels"][0], levels[1]]
    assert cli(*decide, "--max-levels", "2", "--stop-below", "0", "--min-drop", "-1", "--decide", "1") == 0
    assert json.loads((runs / "carve.json").read_text())["levels"][1]["decision"]["rule"] == STOP_MAX

    # the default threshold: the tiny levels' criterion (0) is below 0.05, level 0 is enough, and the stop
    # drops the measurements above it
    assert cli(*decide, "--decide", "0") == 0
    data = json.loads((runs / "carve.json").read_text())
    assert [r["decision"]["rule"] for r in data["levels"]] == [STOP_BELOW] and "measured_above" not in data
    assert (
        "Decision after level 0: stopped, criterion 0.0000 is below --stop-below 0.05"
        in (runs / "carve.md").read_text()
    )

    # runs in folders named stage<l> are read with --level-prefix stage; the prefix only reads, never trains
    other = tmp_path / "other"
    shutil.copytree(runs / "level0", other / "stage0")
    old = ["carve", "--shards", arrhythmia_shards, "--run-dir", other, "--level-prefix", "stage"]
    assert cli(*old, *carve_on, "--decide", "0") == 0
    assert [r["run_dir"] for r in json.loads((other / "carve.json").read_text())["levels"]] == [str(other / "stage0")]
    assert cli(*old, *carve_on) == 2
    assert "--level-prefix stage reads finished runs: give it with --decide LEVEL" in capsys.readouterr().err
