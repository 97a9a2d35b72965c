"""Shared by the pretraining tests: the tiny configs, quick flags, and reading a run's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ecgpos.cli import main
from ecgpos.resources import config_dir
from ecgpos.runs.run_folder import newest_checkpoint

TINY0 = config_dir() / "tiny" / "level0.yaml"
TINY1 = config_dir() / "tiny" / "level1.yaml"
# Small and quick: 48 records, global batch 8 -> 6 steps per epoch.
FAST = ["--set", "train.batch_size=8", "--set", "train.num_workers=0", "--set", "train.log_every=1"]
# A learning check: a tiny level 0 on smooth_like shards (tests/shard_fixtures.py), 300 steps with a
# quarter of the patches masked, beats predicting the mean by LEARNS_MARGIN. Targets are normalised
# per patch (mean 0, variance 1), so the mean predictor (0 everywhere) scores 1.0; at the tiny
# config's own 75 % masking the tiny model stays on that plateau for hundreds of CPU steps.
LEARNS = ["--set", "optim.steps=300", "--set", "mask_ratio=0.25", "--set", "optim.lr=2e-3"]
LEARNS += ["--set", "train.figure_every=1000", "--set", "train.checkpoint_every=1000"]
MEAN_PREDICTOR_LOSS = 1.0
LEARNS_MARGIN = 0.9  # the last 10 steps' mean loss is below 0.9 x the mean predictor's (measured: ~0.80)


def beats_the_mean_predictor(curve: list[float]) -> tuple[bool, float]:
    """Whether the mean of a loss curve's last 10 steps is below LEARNS_MARGIN x MEAN_PREDICTOR_LOSS."""
    last = sum(curve[-10:]) / len(curve[-10:])
    return last < LEARNS_MARGIN * MEAN_PREDICTOR_LOSS, last


# The 40-step level-0 run (conftest's `run0`), checkpoints and figures at steps 20 and 40.
RUN0 = ["--set", "optim.steps=40", "--set", "train.checkpoint_every=20", "--set", "train.figure_every=20"]


def pretrain_args(level: int, shards: Path, run: Path, *extra: str, config: Path | None = None) -> list[str]:
    """The flags of `ecgpos pretrain` with the tiny config of `level` and FAST (+ `extra`)."""
    return [
        "--level",
        str(level),
        "--config",
        str(config or (TINY0 if level == 0 else TINY1)),
        "--shards",
        str(shards),
        "--run-dir",
        str(run),
        *FAST,
        *extra,
    ]


def pretrain(level: int, shards: Path, run: Path, *extra: str, config: Path | None = None) -> int:
    return main(["pretrain", *pretrain_args(level, shards, run, *extra, config=config)])


def build_trainer(shards: Path, run: Path, *extra: str):
    """A level-0 Trainer on the tiny config and FAST, built as `ecgpos pretrain` builds it, not yet run."""
    from ecgpos.cli.pretrain import build_parser
    from ecgpos.pretrain.plan import prepare
    from ecgpos.pretrain.trainer import Trainer

    return Trainer(prepare(build_parser().parse_args(pretrain_args(0, shards, run, *extra))))


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(newest_checkpoint(run) / "model.safetensors"))


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)
