"""`ecgpos pretrain` refuses bad input before training: one line on stderr, exit 2, nothing started."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pretrain_helpers import RUN0, TINY0, TINY1, pretrain_args
from shard_fixtures import write_tiny_shards

from ecgpos.cli import main
from ecgpos.errors import ConfigError
from ecgpos.pretrain.plan import load_base
from ecgpos.runs.run_config import load_run_config


def _base_variant(run0: Path, tmp_path: Path, edit: str) -> Path:
    """A copy of the level-0 run made incomplete or inconsistent in one way."""
    copy = tmp_path / f"base-{edit}"
    shutil.copytree(run0, copy)
    if edit == "no-checkpoint":
        shutil.rmtree(copy / "checkpoints")
        (copy / "checkpoints").mkdir()
        (copy / "checkpoints" / "step-0000040.tmp").mkdir()
    elif edit == "unfinished":
        shutil.rmtree(copy / "checkpoints" / "step-0000040")
        info = json.loads((copy / "run_info.json").read_text())
        (copy / "run_info.json").write_text(json.dumps({**info, "finished": False, "step": 20}))
    elif edit == "other-spec":
        text = (copy / "config.yaml").read_text()
        (copy / "config.yaml").write_text(text.replace("lowpass_hz: 40.0", "lowpass_hz: 35.0"))
    return copy


BAD_CASES = {
    "missing shards": (0, lambda s, r0, t: ["--shards", str(t / "nowhere")], "does not exist"),
    "empty shards": (0, lambda s, r0, t: ["--shards", str((t / "empty").mkdir() or t / "empty")], "no shard-"),
    "other spec": (
        0,
        lambda s, r0, t: [
            "--shards",
            str(
                write_tiny_shards(
                    t / "s35", n_records=8, spec=load_run_config(TINY0).preprocess.__class__(lowpass_hz=35.0)
                )
            ),
        ],
        "lowpass_hz",
    ),
    "unknown key": (0, lambda s, r0, t: ["--set", "train.bogus=1"], "unknown config key(s): train.bogus"),
    "unknown yaml key": (
        0,
        lambda s, r0, t: ["--config", str(_yaml(t, "optim:\n  lr: 1.0e-3\n  warmup: 5\n"))],
        "optim.warmup",
    ),
    "mask ratio 1": (0, lambda s, r0, t: ["--set", "mask_ratio=1.0"], "mask_ratio"),
    "mask ratio 0": (0, lambda s, r0, t: ["--set", "mask_ratio=0"], "mask_ratio"),
    "mask ratio 1.5": (0, lambda s, r0, t: ["--set", "mask_ratio=1.5"], "mask_ratio"),
    "window not multiple": (
        0,
        lambda s, r0, t: ["--set", "preprocess.window=2000", "--set", "encoder.seq_len=2000"],
        "not a multiple of encoder.patch_size",
    ),
    "seq_len != window": (0, lambda s, r0, t: ["--set", "encoder.seq_len=1500"], "must equal preprocess.window"),
    "batch > records": (0, lambda s, r0, t: ["--set", "train.batch_size=64"], "fewer than the global batch"),
    "level contradicts config": (1, lambda s, r0, t: ["--config", str(TINY0), "--base", str(r0)], "contradicts"),
    "stage0 alias at level 0": (0, lambda s, r0, t: ["--stage0", str(r0)], "--stage0 is --base at --level 1 only"),
    "level 1 without base": (1, lambda s, r0, t: [], "needs --base"),
    "base missing": (1, lambda s, r0, t: ["--base", str(t / "nothing")], "does not exist"),
    "base not a run": (1, lambda s, r0, t: ["--base", str(s)], "neither a run folder"),
    "base no checkpoint": (
        1,
        lambda s, r0, t: ["--base", str(_base_variant(r0, t, "no-checkpoint"))],
        "no complete checkpoint",
    ),
    "base unfinished": (1, lambda s, r0, t: ["--base", str(_base_variant(r0, t, "unfinished"))], "is incomplete"),
    "base other spec": (
        1,
        lambda s, r0, t: ["--base", str(_base_variant(r0, t, "other-spec"))],
        "the base encoder",
    ),
    "base width": (1, lambda s, r0, t: ["--base", str(r0), "--set", "encoder.width=32"], "width 64"),
    "level-1 run as base": (1, lambda s, r0, t: ["--base", str(_level1_like(r0, t))], "is a level-1 run"),
    "level 2 on a level-0 base": (2, lambda s, r0, t: ["--base", str(r0)], "level 2 trains on levels 0..1"),
    "base and its stage0 alias": (1, lambda s, r0, t: ["--base", str(r0), "--stage0", str(r0)], "give --base only"),
}


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def _level1_like(run0: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "level1-like"
    shutil.copytree(run0, copy)
    (copy / "config.yaml").write_text((copy / "config.yaml").read_text().replace("level: 0", "level: 1"))
    return copy


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_input_exits_2_with_one_line_before_training(
    case: str, shards: Path, run0: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    level, extra, expected = BAD_CASES[case]
    run = tmp_path / "run"
    args = ["pretrain", *pretrain_args(level, shards, run)]
    capsys.readouterr()
    rc = main(args + extra(shards, run0, tmp_path))  # later --config/--shards flags win in argparse
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and err.startswith("ecgpos pretrain: error: "), err
    assert expected in err, err
    assert not run.exists()  # nothing was started


def test_existing_run_needs_resume_and_same_config(
    run0: Path, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    base = ["pretrain", *pretrain_args(0, shards, run0, *RUN0)]
    before = (run0 / "metrics.jsonl").read_text()
    assert main(base) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(base + ["--set", "optim.lr=0.01", "--resume", "auto"]) == 2
    assert "optim.lr: 0.001 -> 0.01" in capsys.readouterr().err
    assert (run0 / "metrics.jsonl").read_text() == before


def test_level1_on_other_shards_than_its_level0_warns(run0: Path, shards: Path, export: Path, tmp_path: Path, capsys):
    """Level 1 on the pool its level 0 was pretrained on is silent; on another folder it names both
    (a warning, not a refusal: the same shards mounted elsewhere are legitimate)."""
    args = ("--base", str(run0), "--set", "optim.steps=1")
    assert main(["pretrain", *pretrain_args(1, shards, tmp_path / "same", *args)]) == 0
    assert "warning" not in capsys.readouterr().err
    other = tmp_path / "copy"
    shutil.copytree(shards, other)
    assert main(["pretrain", *pretrain_args(1, other, tmp_path / "other", *args)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and str(other.resolve()) in err[0] and str(shards.resolve()) in err[0], err
    # An export carries its pretraining shards in config.json: the same check applies.
    training = json.loads((export / "config.json").read_text())["training"]
    _, _, info = load_base(export, load_run_config(TINY1))
    assert info["kind"] == "export" and info["shards"] == training["shards"] and info["shards"]


def test_an_export_of_an_unfinished_level0_run_is_a_base(tiny_run: Path, tmp_path: Path) -> None:
    """The refusal of an unfinished --base run says "export that checkpoint and pass the export
    folder": that export is then accepted (its config.json records the run's unfinished state)."""
    unfinished, out = tmp_path / "run", tmp_path / "export"
    shutil.copytree(tiny_run, unfinished)
    shutil.rmtree(unfinished / "checkpoints" / "step-0000004")
    with pytest.raises(ConfigError, match="incomplete"):
        load_base(unfinished, load_run_config(TINY1))
    assert main(["export", "--run-dir", str(unfinished), "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["training"]["finished"] is False
    _, _, info = load_base(out, load_run_config(TINY1))
    assert info["kind"] == "export"


@pytest.mark.parametrize("flag", ["--base", "--stage0"])
@pytest.mark.parametrize("case", ["base missing", "base not a run", "base unfinished", "level-1 run as base"])
def test_a_refused_base_is_named_by_the_flag_given(
    case: str, flag: str, shards: Path, run0: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    level, extra, expected = BAD_CASES[case]
    given = [flag, *extra(shards, run0, tmp_path)[1:]]
    capsys.readouterr()
    assert main(["pretrain", *pretrain_args(level, shards, tmp_path / "run"), *given]) == 2
    err = capsys.readouterr().err.strip()
    other = "--stage0" if flag == "--base" else "--base"
    assert err.startswith(f"ecgpos pretrain: error: {flag} {given[1]} ") and other not in err, err
