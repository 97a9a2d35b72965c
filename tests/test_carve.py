"""`ecgpos carve`: the stop rules on constructed criteria, and one carve end to end on the real samples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_runs import cli

from ecgpos.objectives.criterion import criterion
from ecgpos.pretrain.carve_plan import CONTINUE, STOP_BELOW, STOP_DROP, STOP_MAX, decide
from ecgpos.pretrain.carving import shard_violations, validation_index
from ecgpos.pretrain.data import ShardDataset

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]


def test_stops_below_the_threshold() -> None:
    d = decide([0.5, 0.04], max_levels=4, stop_below=0.05, min_drop=0.01)
    assert (d.stop, d.rule) == (True, STOP_BELOW) and "0.0400" in d.reason
    assert decide([0.01], 4, 0.05, 0.01).rule == STOP_BELOW  # level 0 alone can be enough


def test_stops_when_the_criterion_no_longer_falls() -> None:
    d = decide([0.5, 0.3, 0.295], max_levels=5, stop_below=0.05, min_drop=0.01)
    assert (d.stop, d.rule) == (True, STOP_DROP) and "+0.0050" in d.reason
    assert decide([0.3, 0.35], 5, 0.05, 0.01).rule == STOP_DROP  # a rise is no drop


def test_stops_at_the_depth_budget_and_carves_on_before() -> None:
    assert decide([0.5, 0.3], max_levels=2, stop_below=0.05, min_drop=0.01).rule == STOP_MAX
    go = decide([0.5, 0.3], max_levels=3, stop_below=0.05, min_drop=0.01)
    assert (go.stop, go.rule) == (False, CONTINUE) and "level 2" in go.reason
    # the threshold wins over the budget: the reason names the rule that would stop anyway
    assert decide([0.5, 0.01], max_levels=2, stop_below=0.05, min_drop=0.01).rule == STOP_BELOW


def test_bad_settings_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cli("carve", "--shards", tmp_path, "--run-dir", tmp_path / "r", "--max-levels", "0") == 2
    assert "--max-levels must be at least 1" in capsys.readouterr().err


@pytest.mark.slow
def test_carve_three_levels_on_the_real_samples(arrhythmia_shards: Path, tmp_path: Path) -> None:
    """Three tiny levels, the criterion after each equal to the trainer's last val_push_violation and to
    a measurement with another batch size; a rerun resumes (trains nothing, keeps the measurements)."""
    runs = tmp_path / "carve"
    args = ["carve", "--config", "tiny/stage0", "--latent-config", "tiny/stage1", "--shards", arrhythmia_shards]
    args += ["--run-dir", runs, "--max-levels", "3", "--stop-below", "0", "--min-drop", "-1", *FAST]
    assert cli(*args) == 0
    levels = json.loads((runs / "carve.json").read_text())["levels"]
    assert [r["level"] for r in levels] == [0, 1, 2]
    assert [r["decision"]["rule"] for r in levels] == [CONTINUE, CONTINUE, STOP_MAX]
    val = ShardDataset(validation_index(arrhythmia_shards, 0.1), 2250, train=False)
    from ecgpos.runs.run_folder import load_run_model

    for r in levels:
        run = runs / f"level{r['level']}"
        logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert r["records"] == len(val) == 22 and r["steps"] == 2
        assert r["criterion"] == pytest.approx(
            [x for x in logged if "val_push_violation" in x][-1]["val_push_violation"]
        )
        again = shard_violations(load_run_model(run)[0], val, 7)
        assert criterion(again) == pytest.approx(r["criterion"], abs=1e-12)
        assert r["interval"][0] <= r["criterion"] <= r["interval"][1]
    text = (runs / "carve.md").read_text()
    assert "| 2 |" in text and "Decision after level 2: stopped, reached --max-levels 3" in text
    assert (runs / "carve.png").stat().st_size > 10_000
    stamp = (runs / "level2" / "run_info.json").stat().st_mtime_ns
    assert cli(*args) == 0  # resumes: every level is finished, nothing is trained again
    assert (runs / "level2" / "run_info.json").stat().st_mtime_ns == stamp
    assert json.loads((runs / "carve.json").read_text())["levels"] == levels
