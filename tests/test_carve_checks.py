"""`ecgpos carve` on a folder it finds populated: finished levels are kept only when they are what the command
would train (config, held-out fraction, shards, base), every level's config and the arguments are checked
before level 0 starts, and a damaged carve.json is measured again. Each refusal is one line, exit 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny_runs import cli, pretrain_tiny

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
CARVE = ["carve", "--config", "tiny/level0", "--latent-config", "tiny/level1"]
RULES = ["--max-levels", "2", "--stop-below", "0", "--min-drop", "-1", "--latent-set", "optim.steps=3"]


def _files(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in sorted(folder.rglob("*"))}


def _one_line(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture(scope="module")
def carved(arrhythmia_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-level tiny carve (level 0 trained 2 steps, level 1 3 steps, holding out 10 %)."""
    runs = tmp_path_factory.mktemp("carved") / "carve"
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", runs, *RULES, *FAST) == 0
    return runs


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--val-fraction", "0.2"], "trained with train.val_fraction=0.1, not --val-fraction 0.2"),
        (["--set", "optim.steps=3"], "optim.steps: 2 -> 3"),
        (["--latent-set", "optim.steps=4"], "level 1 ("),
    ],
)
def test_a_finished_carve_refuses_other_settings_before_measuring(
    carved: Path, arrhythmia_shards: Path, capsys: pytest.CaptureFixture, extra: list[str], said: str
) -> None:
    before = _files(carved)
    capsys.readouterr()
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", carved, *RULES, *FAST, *extra) == 2
    assert said in _one_line(capsys)
    assert _files(carved) == before  # nothing measured, trained or rewritten


def test_a_finished_carve_run_again_keeps_its_levels_and_says_so(
    carved: Path, arrhythmia_shards: Path, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", carved, *RULES, *FAST) == 0
    assert f"keeping the finished levels 0..1 in {carved}" in capsys.readouterr().out


def test_a_level_run_that_trained_on_its_held_out_records_is_not_adopted(
    carved: Path, arrhythmia_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "carve"
    pretrain_tiny(0, arrhythmia_shards, runs / "level0", *FAST, "--set", "train.val_fraction=0.0")
    capsys.readouterr()
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", runs, *RULES, *FAST) == 2
    assert "level 0" in (line := _one_line(capsys)) and "train.val_fraction=0.0, not --val-fraction 0.1" in line
    assert not (runs / "carve.json").exists() and not (runs / "level1").exists()


def test_a_level_on_another_base_breaks_the_chain(
    carved: Path, arrhythmia_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A copied carve folder: its level 1 was trained on the original's level 0, not on the copy's."""
    copy = tmp_path / "copy"
    shutil.copytree(carved, copy)
    capsys.readouterr()
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", copy, *RULES, *FAST) == 2
    line = _one_line(capsys)
    assert f"trained on the base {carved / 'level0'}, not on level 0 of this folder" in line


def test_a_level_trained_on_other_shards_is_refused(
    carved: Path, tiny_shards: Path, capsys: pytest.CaptureFixture
) -> None:
    capsys.readouterr()
    assert cli(*CARVE, "--shards", tiny_shards, "--run-dir", carved, *RULES, *FAST) == 2
    assert "was trained on the shards" in _one_line(capsys)


def test_every_levels_config_is_checked_before_level_0_trains(
    arrhythmia_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "carve"
    args = ["carve", "--config", "tiny/level0", "--latent-config", "tiny/level0", "--shards", arrhythmia_shards]
    assert cli(*args, "--run-dir", runs, *RULES, *FAST) == 2
    assert "--latent-config tiny/level0 cannot train level 1" in _one_line(capsys)
    assert not runs.exists()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--min-drop", "nan"], "--min-drop must be a finite number"),
        (["--min-drop", "inf"], "--min-drop must be a finite number"),
        (["--stop-below", "nan"], "--stop-below"),
        (["--nominal", "A"], "--nominal only takes effect with --geometry-task"),
        (["--anomalous", "X", "--nominal", "A"], "--nominal, --anomalous only take effect with --geometry-task"),
        (["--probe-args", "--seeds 1"], "--probe-args only takes effect with --probe-task"),
    ],
)
def test_arguments_that_switch_a_rule_off_or_go_unused_are_refused(
    arrhythmia_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture, extra: list[str], said: str
) -> None:
    runs = tmp_path / "carve"
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", runs, *FAST, *extra) == 2
    assert said in _one_line(capsys)
    assert not runs.exists()


def test_run_dir_into_an_export_a_shard_folder_or_foreign_files_is_refused_and_writes_nothing(
    carved: Path, arrhythmia_shards: Path, tiny_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    export = tmp_path / "export"
    assert cli("export", "--run-dir", carved / "level0", "--out", export) == 0
    copy = tmp_path / "export-copy"
    shutil.copytree(export, copy)
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine\n")
    for folder, said in (
        (copy, "is an export folder"),
        (tiny_shards, "the shard folder"),
        (carved / "level0", "the training run"),
        (foreign, "holds files carve did not write (todo.txt"),
    ):
        before = _files(folder)
        capsys.readouterr()
        assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", folder, *RULES, *FAST) == 2
        assert said in _one_line(capsys)
        assert _files(folder) == before


def test_a_truncated_carve_json_is_measured_again(
    carved: Path, arrhythmia_shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = tmp_path / "carve"
    shutil.copytree(carved, runs, symlinks=True)
    # the copy's levels must be this folder's chain: point level 1's base at the copy's level 0
    info = json.loads((runs / "level1" / "run_info.json").read_text())
    (runs / "level1" / "run_info.json").write_text(json.dumps({**info, "base": str(runs / "level0")}))
    want = json.loads((carved / "carve.json").read_text())["levels"]
    text = (runs / "carve.json").read_text()
    (runs / "carve.json").write_text(text[:300])  # cut inside level 0's entry
    capsys.readouterr()
    assert cli(*CARVE, "--shards", arrhythmia_shards, "--run-dir", runs, *RULES, *FAST) == 0
    assert f"{runs / 'carve.json'} is damaged" in capsys.readouterr().err
    got = json.loads((runs / "carve.json").read_text())["levels"]
    assert [(r["level"], r["criterion"], r["records"]) for r in got] == [
        (r["level"], r["criterion"], r["records"]) for r in want
    ]


def test_an_export_of_the_lower_levels_describes_them_not_the_run_it_was_cut_from(carved: Path, tmp_path: Path) -> None:
    """`export --run-dir LEVEL1 --level 0`: the weights are level 0's (2 steps), so are the card and config.json."""
    out = tmp_path / "export"
    assert cli("export", "--run-dir", carved / "level1", "--level", "0", "--out", out) == 0
    training = json.loads((out / "config.json").read_text())["training"]
    assert (training["level"], training["step"], training["steps"]) == (0, 2, 2)
    assert training["run_dir"] == str((carved / "level0").resolve())
    assert Path(training["checkpoint"]).parent.parent == (carved / "level0").resolve()
    assert training["exported_levels"] == "0..0" and training["cut_from"] == str((carved / "level1").resolve())
    card = (out / "README.md").read_text()
    assert "- Level: 0\n" in card and "- Optimiser steps: 2 of 2 (finished)" in card
    assert f"cut from the nest of {(carved / 'level1').resolve()}" in card and "of 3" not in card
