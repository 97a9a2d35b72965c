"""`ecgpos pretrain` end to end on tiny shards: outputs, resume, level 1, processes, logged statistics."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from pretrain_helpers import (
    FAST,
    LEARNS,
    LEARNS_MARGIN,
    MEAN_PREDICTOR_LOSS,
    RUN0,
    TINY0,
    beats_the_mean_predictor,
    max_diff,
    metrics,
    pretrain,
    weights,
)
from shard_fixtures import smooth_like, write_tiny_shards

from ecgpos.cli import main
from ecgpos.config import load_config
from ecgpos.export.format import weights_hash
from ecgpos.inference.resolve import load_run_encoder
from ecgpos.pretrain.data import ShardDataset, StepBatchSampler
from ecgpos.pretrain.records import read_index
from ecgpos.pretrain.schedule import lr_at
from ecgpos.resources import config_dir
from ecgpos.runs.run_config import RunConfig, load_run_config
from ecgpos.runs.run_folder import list_checkpoints, newest_checkpoint

CONFIG_DIR = config_dir()
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def test_lr_schedule_paper_values() -> None:
    optim = load_run_config(CONFIG_DIR / "level0.yaml").optim
    assert lr_at(0, optim) == pytest.approx(3.75e-5 / 15000)
    assert lr_at(7499, optim) == pytest.approx(3.75e-5 / 2)
    assert lr_at(14999, optim) == pytest.approx(3.75e-5)  # warm-up reaches the peak
    assert lr_at(15000, optim) == pytest.approx(3.75e-5)  # cosine starts at the peak
    assert lr_at(82500, optim) == pytest.approx((3.75e-5 + 1e-6) / 2)  # half-way: the mean
    assert lr_at(150000, optim) == pytest.approx(1e-6)  # cosine ends at min_lr
    assert lr_at(10**6, optim) == pytest.approx(1e-6)
    decay = [lr_at(s, optim) for s in range(15000, 150001, 500)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    # A pure function of the step: order of evaluation and history do not matter.
    steps = [149999, 3, 15000, 3, 80000]
    assert [lr_at(s, optim) for s in steps] == [lr_at(s, optim) for s in reversed(steps)][::-1]


def test_tiny_levels_beat_the_mean_predictor(tmp_path: Path) -> None:
    """Learning, stated against what predicting the mean scores, not against the first loss: level 0
    with LEARNS on smooth_like shards (tests/pretrain_helpers.py) against 1.0 (per-patch-normalised
    targets), then level 1 on it (its own 75 % masking, 150 steps) against the variance of its
    targets, the latent patch tokens of the training windows (not normalised)."""
    shards = write_tiny_shards(tmp_path / "smooth", n_records=48, records_per_shard=24, signal=smooth_like)
    assert pretrain(0, shards, tmp_path / "level0", *LEARNS) == 0
    curve = [r["loss"] for r in metrics(tmp_path / "level0") if "loss" in r]
    beats, last = beats_the_mean_predictor(curve)
    assert len(curve) == 300 and beats, f"level 0: last 10 steps {last:.4f}, mean predictor {MEAN_PREDICTOR_LOSS}"
    level1 = ["--set", "optim.steps=150", "--set", "optim.lr=2e-3", "--set", "train.checkpoint_every=1000"]
    assert pretrain(1, shards, tmp_path / "level1", *level1, "--base", str(tmp_path / "level0")) == 0
    windows = ShardDataset(read_index(shards), 2250, train=False)
    with torch.no_grad():
        x = torch.stack([windows[i] for i in range(len(windows))]).float()
        tokens = load_run_encoder(tmp_path / "level0").module.forward_tokens(x)
    targets = tokens.reshape(len(windows), 12, -1, tokens.shape[-1])[:, :, 1:-1].reshape(-1, tokens.shape[-1])
    mean_predictor = float(targets.var(dim=0, unbiased=False).mean())
    curve = [r["recon_loss"] for r in metrics(tmp_path / "level1") if "loss" in r]
    last = sum(curve[-10:]) / 10  # measured: ~0.50 against ~0.72
    assert last < LEARNS_MARGIN * mean_predictor, (
        f"level 1: last 10 steps {last:.4f}, mean predictor {mean_predictor:.4f}"
    )


def test_tiny_level0_run_writes_everything(run0: Path) -> None:
    records = [r for r in metrics(run0) if "loss" in r]
    assert [r["step"] for r in records] == list(range(1, 41))
    assert {"step", "loss", "lr", "grad_norm", "samples_per_s", "epoch"} <= records[0].keys()
    cfg = load_config(RunConfig, run0 / "config.yaml")
    assert cfg.optim.steps == 40 and cfg.train.batch_size == 8 and cfg.encoder.width == 64
    assert [r["lr"] for r in records] == [lr_at(s, cfg.optim) for s in range(40)]
    assert json.loads((run0 / "spec.json").read_text()) == cfg.preprocess.to_dict()
    assert list((run0 / "tb").glob("events.out.tfevents.*"))
    assert [s for s, _ in list_checkpoints(run0)] == [20, 40]
    state = json.loads((newest_checkpoint(run0) / "trainer_state.json").read_text())
    assert (state["step"], state["epoch"], state["batch_in_epoch"]) == (40, 6, 4)  # 6 steps per epoch
    umask = os.umask(0)
    os.umask(umask)
    # the weights too (safetensors writes files owner-only): a run is read by collaborators and other jobs
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in newest_checkpoint(run0).iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes
    info = json.loads((run0 / "run_info.json").read_text())
    assert info["finished"] and info["step"] == 40 and info["level"] == 0 and info["base"] is None
    for name in ("recon-step-0000020.png", "recon-step-0000040.png", "curves.png"):
        png = (run0 / "figures" / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000


def test_resume_mid_epoch_equals_uninterrupted(run0: Path, shards: Path, tmp_path: Path) -> None:
    """A crash after the step-20 checkpoint (mid-epoch: 20 = 3 x 6 + 2), resumed, ends where the
    uninterrupted run ended: same parameters and the same logged losses."""
    crashed = tmp_path / "crashed"
    shutil.copytree(run0, crashed)
    shutil.rmtree(crashed / "checkpoints" / "step-0000040")
    (crashed / "checkpoints" / "step-0000030.tmp").mkdir()  # a save interrupted mid-write
    assert pretrain(0, shards, crashed, *RUN0, "--resume", "auto") == 0
    assert max_diff(weights(crashed), weights(run0)) <= 1e-6
    straight, resumed = metrics(run0), metrics(crashed)
    assert [r["step"] for r in resumed] == list(range(1, 41))
    assert [r["loss"] for r in resumed[20:]] == pytest.approx([r["loss"] for r in straight[20:]], abs=1e-6)
    assert not (crashed / "checkpoints" / "step-0000030.tmp").exists()


def test_level1_on_tiny_level0(run0: Path, shards: Path, tmp_path: Path) -> None:
    level0_file = newest_checkpoint(run0) / "model.safetensors"
    before = level0_file.read_bytes()
    run1 = tmp_path / "level1"
    level1_args = ("--base", str(run0), "--set", "optim.steps=30", "--set", "train.checkpoint_every=15")
    assert pretrain(1, shards, run1, *level1_args) == 0
    assert level0_file.read_bytes() == before
    crashed = tmp_path / "level1-crashed"  # resume equivalence, as for level 0 (15 = 2 x 6 + 3: mid-epoch)
    shutil.copytree(run1, crashed)
    shutil.rmtree(crashed / "checkpoints" / "step-0000030")
    assert pretrain(1, shards, crashed, *level1_args, "--resume", "auto") == 0
    assert max_diff(weights(crashed), weights(run1)) <= 1e-6
    records = [r for r in metrics(run1) if "loss" in r]
    assert "recon_loss" in records[0]
    # The frozen level-0 inside the level-1 checkpoint is bit-identical to the level-0 run's encoder.
    encoder0 = load_run_encoder(run0).module
    level1_state = weights(run1)
    for name, tensor in encoder0.state_dict().items():
        assert torch.equal(level1_state[f"base.{name}"], tensor), name
    nested = load_run_encoder(run1)
    assert nested.arch["kind"] == "nested" and not nested.module.training
    assert weights_hash(nested.module.levels[0]) == weights_hash(encoder0)
    x = torch.randn(3, 12, 2250, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        f1, f2 = nested.module.forward_features(x), nested.module.forward_features(x)
    assert f1.shape == (3, 64) and torch.equal(f1, f2) and float((f1[0] - f1[1]).abs().max()) > 1e-4
    assert list((run1 / "figures").glob("latent-step-*.png"))


def test_tiny_config_on_real_sample_shards(arrhythmia_shards: Path, tmp_path: Path) -> None:
    """The shipped tiny config as is (DataLoader worker included) on the real ecg-arrhythmia shards."""
    run = tmp_path / "real"
    args = [
        "pretrain",
        "--level",
        "0",
        "--config",
        str(TINY0),
        "--shards",
        str(arrhythmia_shards),
        "--run-dir",
        str(run),
        "--set",
        "optim.steps=30",
        "--set",
        "train.checkpoint_every=15",
        "--set",
        "train.figure_every=15",
    ]
    assert main(args) == 0
    losses = [r["loss"] for r in metrics(run)]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0]  # log steps 10, 20, 30 and checkpoint step 15
    assert (run / "figures" / "recon-step-0000030.png").stat().st_size > 20_000
    shutil.rmtree(run / "checkpoints" / "step-0000030")
    assert main(args + ["--resume", "auto"]) == 0
    assert [r["step"] for r in metrics(run)] == [10, 15, 20, 30] and newest_checkpoint(run).name == "step-0000030"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_match_one_process_with_accumulation(shards: Path, tmp_path: Path, capsys) -> None:
    """2 processes (gloo) x accum 1 and 1 process x accum 2 see the same global batches, masks and lr:
    same losses, validation losses and parameters. So a 2-process run resumes exactly on 1 process
    with accum 2, and on 1 process with accum 1 (other masks) it is refused in one line."""
    common = ["--level", "0", "--config", str(TINY0), "--shards", str(shards), *FAST, "--set", "optim.steps=4"]
    common += ["--set", "train.checkpoint_every=2", "--set", "train.val_fraction=0.25", "--set", "train.val_every=2"]
    # CPU and gloo for both, also on a machine with one GPU (where --multi_gpu would start two ranks on it)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(PROJECT_ROOT), "CUDA_VISIBLE_DEVICES": ""}
    # `accelerate launch --cpu` runs one process (multi-CPU needs mpirun there); --multi_gpu starts torchrun,
    # and ecgpos picks gloo on hosts without CUDA.
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        "-m",
        "ecgpos.pretrain",
    ]
    done = subprocess.run(
        [*launch, *common, "--run-dir", str(tmp_path / "two")], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert main(["pretrain", *common, "--run-dir", str(tmp_path / "one"), "--set", "train.grad_accum=2"]) == 0
    two, one = (json.loads((tmp_path / n / "run_info.json").read_text()) for n in ("two", "one"))
    assert (two["num_processes"], two["per_process_batch"], two["global_batch"]) == (2, 4, 8)
    assert (one["num_processes"], one["per_process_batch"], one["global_batch"]) == (1, 4, 8)
    m2, m1 = metrics(tmp_path / "two"), metrics(tmp_path / "one")
    assert [r["step"] for r in m2] == [r["step"] for r in m1] == [1, 2, 2, 3, 4, 4]
    assert [r.get("lr") for r in m2] == [r.get("lr") for r in m1]
    assert [r.get("loss") for r in m2] == pytest.approx([r.get("loss") for r in m1], abs=1e-5)
    assert [r.get("val_loss") for r in m2] == pytest.approx([r.get("val_loss") for r in m1], abs=1e-6)
    assert max_diff(weights(tmp_path / "two"), weights(tmp_path / "one")) <= 1e-5
    resumed = tmp_path / "two-resumed"
    shutil.copytree(tmp_path / "two", resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-0000004")
    capsys.readouterr()
    assert main(["pretrain", *common, "--run-dir", str(resumed), "--resume", "auto"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "processes x train.grad_accum = 2 x 1" in err and "train.grad_accum=2" in err, err
    assert (
        main(["pretrain", *common, "--run-dir", str(resumed), "--resume", "auto", "--set", "train.grad_accum=2"]) == 0
    )
    assert [r.get("loss") for r in metrics(resumed)] == pytest.approx([r.get("loss") for r in m2], abs=1e-5)
    assert [r.get("val_loss") for r in metrics(resumed)] == pytest.approx([r.get("val_loss") for r in m2], abs=1e-6)
    assert max_diff(weights(resumed), weights(tmp_path / "two")) <= 1e-5


def _direct_step0(shards: Path, cfg: RunConfig, micro: int) -> tuple[float, float]:
    """Loss (mean over micro-batches) and grad norm of step 1, computed without the trainer."""
    from ecgpos.pretrain.data import ShardDataset
    from ecgpos.pretrain.records import read_index
    from ecgpos.pretrain.schedule import step_generator
    from ecgpos.runs.levels import build_model

    index = read_index(shards)
    data = ShardDataset(index, cfg.preprocess.window, train=True, seed=cfg.train.seed)
    sampler = StepBatchSampler(len(index), cfg.train.batch_size, micro, 1, 0, seed=cfg.train.seed)
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg).train()
    losses = []
    for m, items in enumerate(sampler.micro_batches(0)):
        x = torch.stack([data[item] for item in items]).float()
        loss = model(x, generator=step_generator(cfg.train.seed, 0, m))["loss"]
        (loss / micro).backward()
        losses.append(float(loss.detach()))
    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], float("inf"))
    return sum(losses) / micro, float(norm)


def test_logged_stats_equal_a_direct_computation(shards: Path, tmp_path: Path) -> None:
    """metrics.jsonl holds what the steps computed: step 1's loss and grad norm recomputed by hand
    (2 micro-batches), and a 2-step record is the mean of the two 1-step records."""
    every = tmp_path / "every"
    accum = ("--set", "train.grad_accum=2", "--set", "optim.steps=2", "--set", "train.figure_every=100")
    assert pretrain(0, shards, every, *accum) == 0
    cfg = load_config(RunConfig, every / "config.yaml")
    loss, norm = _direct_step0(shards, cfg, 2)
    one, two = metrics(every)
    assert one["loss"] == pytest.approx(loss, rel=1e-6)
    assert one["grad_norm"] == pytest.approx(norm, rel=1e-5)
    pair = tmp_path / "pair"
    assert pretrain(0, shards, pair, *accum, "--set", "train.log_every=2") == 0
    (record,) = metrics(pair)
    assert record["step"] == 2 and record["loss"] == pytest.approx((one["loss"] + two["loss"]) / 2, rel=1e-9)
    assert record["grad_norm"] == pytest.approx(two["grad_norm"], rel=1e-9) and record["samples_per_s"] > 0


def test_sparsity_term_is_logged_with_its_share_of_the_loss(run0: Path, shards: Path, tmp_path: Path) -> None:
    run = tmp_path / "sp"
    assert (
        pretrain(
            1,
            shards,
            run,
            "--base",
            str(run0),
            "--set",
            "optim.steps=4",
            "--set",
            "train.log_every=2",
            "--set",
            "push_pull.lambda_sp=0.5",
            "--set",
            "train.figure_every=100",
        )
        == 0
    )
    records = metrics(run)
    assert [r["step"] for r in records] == [2, 4]
    for r in records:
        assert r["sp_loss"] > 0 and r["loss"] == pytest.approx(r["recon_loss"] + 0.5 * r["sp_loss"], rel=1e-6)
