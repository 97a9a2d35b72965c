"""Shared by the pretraining tests: the tiny configs, quick flags, and reading a run's outputs."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from ecgpos.cli import main
from ecgpos.resources import config_dir
from ecgpos.runs.run_folder import newest_checkpoint

TINY0 = config_dir() / "tiny" / "stage0.yaml"
TINY1 = config_dir() / "tiny" / "stage1.yaml"
# Small and quick: 48 records, global batch 8 -> 6 steps per epoch.
FAST = ["--set", "train.batch_size=8", "--set", "train.num_workers=0", "--set", "train.log_every=1"]
# The 40-step Stage-0 run (conftest's `run0`), checkpoints and figures at steps 20 and 40.
RUN0 = ["--set", "optim.steps=40", "--set", "train.checkpoint_every=20", "--set", "train.figure_every=20"]


def pretrain_args(stage: int, shards: Path, run: Path, *extra: str, config: Path | None = None) -> list[str]:
    """The flags of `ecgpos pretrain` with the tiny config of `stage` and FAST (+ `extra`)."""
    return [
        "--stage",
        str(stage),
        "--config",
        str(config or (TINY0 if stage == 0 else TINY1)),
        "--shards",
        str(shards),
        "--run-dir",
        str(run),
        *FAST,
        *extra,
    ]


def pretrain(stage: int, shards: Path, run: Path, *extra: str, config: Path | None = None) -> int:
    return main(["pretrain", *pretrain_args(stage, shards, run, *extra, config=config)])


def build_trainer(shards: Path, run: Path, *extra: str):
    """A Stage-0 Trainer on the tiny config and FAST, built as `ecgpos pretrain` builds it, not yet run."""
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
