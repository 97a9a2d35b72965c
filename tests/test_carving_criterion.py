"""The carving criterion: one definition per level, the same number whatever the batching, and the
same in the trainer's validation log as measured afterwards on the run's validation records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from pretrain_helpers import TINY0, TINY1, pretrain

from ecgpos.objectives.criterion import (
    CRITERION_SEED,
    bootstrap_interval,
    criterion,
    push_triplet,
    record_violations,
    window_generator,
    window_violations,
)
from ecgpos.objectives.push_pull import PushPullConfig, per_sample_distance
from ecgpos.pretrain.carving import shard_violations, validation_index
from ecgpos.pretrain.data import ShardDataset
from ecgpos.runs.levels import build_model
from ecgpos.runs.run_config import load_run_config

torch.set_num_threads(1)
VAL = ["--set", "optim.steps=2", "--set", "train.val_fraction=0.3", "--set", "train.val_every=2"]


def _models() -> dict[int, torch.nn.Module]:
    torch.manual_seed(0)
    level0 = build_model(load_run_config(TINY0, [], level=0)).eval()
    level1 = build_model(load_run_config(TINY1, [], level=1), level0.encoder).eval()
    return {0: level0, 1: level1}


@pytest.fixture(scope="module")
def windows() -> torch.Tensor:
    return torch.randn(6, 12, 2250, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("level", [0, 1])
def test_a_window_answer_does_not_depend_on_its_batch(windows: torch.Tensor, level: int) -> None:
    model = _models()[level]
    names = [(f"r{i // 2}", i % 2) for i in range(len(windows))]
    whole = window_violations(model, windows, names).tolist()
    single = [bool(window_violations(model, windows[i : i + 1], names[i : i + 1])) for i in range(len(windows))]
    order = [5, 2, 0, 4, 1, 3]
    shuffled = window_violations(model, windows[order], [names[i] for i in order]).tolist()
    assert whole == single == [shuffled[order.index(i)] for i in range(len(windows))]
    by_record = record_violations(model, [(names[:3], windows[:3]), (names[3:], windows[3:])])
    assert set(by_record) == {"r0", "r1", "r2"}
    assert by_record["r1"] == pytest.approx((whole[2] + whole[3]) / 2)  # its windows sat in two batches
    assert criterion(by_record) == pytest.approx(sum(by_record.values()) / 3)  # records weigh equally


def test_the_margin_decides() -> None:
    """A level whose reconstruction returns x~ itself violates the margin everywhere; alpha 0 nowhere."""
    model = _models()[1]
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(1))
    model.reconstruct = lambda tokens: model.target(tokens)  # x^ = x~: d(x^, x~) = 0 < alpha * delta
    assert window_violations(model, x, [("a", 0), ("b", 0)]).all()
    model.push_pull.alpha = 0.0
    model.push_pull.enabled = True
    assert not window_violations(model, x, [("a", 0), ("b", 0)]).any()


def test_bootstrap_interval_brackets_the_mean() -> None:
    values = {f"r{i}": float(i % 3 == 0) for i in range(30)}
    lo, hi = bootstrap_interval(values)
    assert lo < criterion(values) < hi and 0.0 <= lo and hi <= 1.0


# push-pull's settings without its loss (lambda_pp 0): at scale 1 and these margins the records of the two-step
# runs below split, so the logged and measured criteria compared are strictly between 0 and 1
SPLIT = {0: 1.5, 1: 1.74}


@pytest.mark.parametrize("level", [0, 1])
def test_trainer_logs_the_criterion_measured_afterwards(shards: Path, tmp_path: Path, level: int) -> None:
    """val_push_violation at every level equals the criterion on the run's validation records, measured
    afterwards with another batch size, split over two processes' shares; the records split, so the
    numbers compared lie strictly between 0 and 1."""
    from ecgpos.runs.run_folder import load_run_model

    base = []
    if level == 1:
        assert pretrain(0, shards, tmp_path / "s0", "--set", "optim.steps=2") == 0
        base = ["--base", str(tmp_path / "s0")]
    run = tmp_path / f"s{level}"
    pp = ["--set", "push_pull.enabled=true", "--set", "push_pull.lambda_pp=0", "--set", "push_pull.scale=1.0"]
    assert pretrain(level, shards, run, *VAL, *pp, "--set", f"push_pull.alpha={SPLIT[level]}", *base) == 0
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    logged = [r["val_push_violation"] for r in logged if "val_push_violation" in r]
    model = load_run_model(run)[0].eval()
    val = ShardDataset(validation_index(shards, 0.3), 2250, train=False)
    whole = shard_violations(model, val, 5)
    halves = [shard_violations(model, val, 2, process_index=p, num_processes=2) for p in (0, 1)]
    assert whole == {**halves[0], **halves[1]} and len(whole) == len(val)
    assert logged and logged[-1] == pytest.approx(criterion(whole), abs=1e-6)  # reduced in float32
    assert 0 < criterion(whole) < 1
    # with alpha at the median margin ratio the records split: still the same answer however they are batched
    names = [(r, 0) for r in val.index.record_id]
    x = torch.stack([val[i] for i in range(len(val))]).float()
    clean, tilde, x_hat = push_triplet(model, x, [window_generator(CRITERION_SEED, r, k) for r, k in names])
    ratio = per_sample_distance(x_hat, tilde) / per_sample_distance(tilde, clean)
    model.push_pull = PushPullConfig(enabled=True, alpha=float(ratio.median()), scale=model.push_pull.scale)
    mixed = shard_violations(model, val, 3)
    assert 0 < criterion(mixed) < 1
    assert (
        mixed
        == shard_violations(model, val, len(val))
        == {
            **shard_violations(model, val, 1, process_index=0, num_processes=3),
            **shard_violations(model, val, 4, process_index=1, num_processes=3),
            **shard_violations(model, val, 2, process_index=2, num_processes=3),
        }
    )
