"""How `ecgpos pretrain` stops: on a signal (a checkpoint, one line, and a resume that finishes) and on a
non-finite loss (the last good checkpoint kept, nothing after it saved)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from pretrain_helpers import build_trainer, metrics, pretrain, pretrain_args, weights
from shard_fixtures import write_tiny_shards

from ecgpos.cli import main
from ecgpos.pretrain.data import StepBatchSampler
from ecgpos.pretrain.records import read_index
from ecgpos.runs.run_folder import list_checkpoints, newest_checkpoint


@pytest.mark.parametrize(
    ("sig", "code", "group"),
    [(signal.SIGUSR1, 0, True), (signal.SIGINT, 130, True), (signal.SIGTERM, 0, False), (signal.SIGTERM, 0, True)],
)
def test_stop_signal_checkpoints_and_resume_finishes(
    shards: Path, tmp_path: Path, sig: int, code: int, group: bool
) -> None:
    """SIGUSR1 (Slurm) or Ctrl-C to the whole process group, as both are delivered: DataLoader workers get
    it too. The run saves a checkpoint at the next step and says so in one line, without a traceback.
    SIGTERM to the trainer (`kill PID`) too: other commands stop at once on it, pretrain keeps its own way;
    and to the whole group (scancel, preemption), where the workers must outlive it for that last step."""
    run = tmp_path / "run"
    args = pretrain_args(
        0,
        shards,
        run,
        "--set",
        "train.num_workers=1",
        "--set",
        "optim.steps=40",
        "--set",
        "train.checkpoint_every=1000",
        "--set",
        "train.figure_every=1000",
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ecgpos.pretrain", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    if group:
        os.killpg(proc.pid, sig)
    else:
        os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err[-2000:]
    name = signal.Signals(sig).name
    info = json.loads((run / "run_info.json").read_text())
    stopped = info["step"]
    assert not info["finished"] and name in info["stopped"] and 3 <= stopped < 40
    assert [s for s, _ in list_checkpoints(run)] == [stopped]
    assert f"stopped by {name} at step {stopped}; checkpoint {newest_checkpoint(run)} saved" in out
    assert "continue with --resume auto" in out and "Traceback" not in err
    assert main(["pretrain", *args, "--resume", "auto"]) == 0
    assert [r["step"] for r in metrics(run)] == list(range(1, 41))
    assert json.loads((run / "run_info.json").read_text())["finished"]
    assert main(["pretrain", *args, "--resume", "auto"]) == 0  # already finished: nothing to do
    finished = (run / "run_info.json").read_text()
    assert json.loads(finished)["finished"] and json.loads(finished)["step"] == 40
    shutil.rmtree(run / "checkpoints")  # deleted after export: a resume would have trained it again from step 0
    assert main(["pretrain", *args, "--resume", "auto"]) == 2
    assert (run / "run_info.json").read_text() == finished and len(metrics(run)) == 40


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sampler = StepBatchSampler(48, 8, 1, 1, 0, seed=0)
    bad_record = int(sampler.global_batch_indices(2)[0])  # first seen at step 3 (index 2)
    assert bad_record not in set(sampler.global_batch_indices(0)) | set(sampler.global_batch_indices(1))
    shards = write_tiny_shards(tmp_path / "nan", n_records=48, records_per_shard=48, nan_records={bad_record})
    run = tmp_path / "run"
    rc = pretrain(0, shards, run, "--set", "optim.steps=6", "--set", "train.checkpoint_every=1")
    err = capsys.readouterr().err.strip()
    assert rc == 1 and "non-finite loss" in err and "step 3" in err and "step-0000002" in err
    # the record behind it is named: damaged shards, not a diverging run
    record = read_index(shards).record_id[bad_record]
    assert f"its batch holds NaN or inf samples of {record} (" in err and "row " in err, err
    assert [s for s, _ in list_checkpoints(run)] == [1, 2]
    assert max(r["step"] for r in metrics(run)) == 2
    info = json.loads((run / "run_info.json").read_text())
    assert not info["finished"] and "step 3" in info["failed"]


def test_non_finite_step_found_at_a_later_boundary_never_reached_the_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The host reads the flag only at log/checkpoint steps: a NaN at step 3, found at step 4, was
    skipped on the device (and so was step 4); nothing is saved after it."""
    sampler = StepBatchSampler(48, 8, 1, 1, 0, seed=0)
    bad_record = int(sampler.global_batch_indices(2)[0])
    shards = write_tiny_shards(tmp_path / "nan", n_records=48, records_per_shard=48, nan_records={bad_record})
    run = tmp_path / "run"
    trainer = build_trainer(
        shards,
        run,
        "--set",
        "optim.steps=6",
        "--set",
        "train.log_every=4",
        "--set",
        "train.checkpoint_every=2",
        "--set",
        "train.figure_every=100",
    )
    assert trainer.run() == 1
    err = capsys.readouterr().err.strip()
    assert "non-finite loss" in err and "step 3" in err and "step-0000002" in err
    assert [s for s, _ in list_checkpoints(run)] == [2]
    assert [r["step"] for r in metrics(run)] == [2]  # the checkpoint step before it; nothing after
    saved = weights(run)
    live = trainer.acc.unwrap_model(trainer.model).state_dict()
    assert saved.keys() <= live.keys()
    for name, tensor in saved.items():
        assert torch.equal(live[name], tensor), name  # steps 3 and 4 changed nothing
    steps = {float(s["step"]) for s in trainer.optimizer.optimizer.state.values()}
    assert steps == {2.0}  # the fused AdamW counted only the two good updates
    info = json.loads((run / "run_info.json").read_text())
    assert "step 3" in info["failed"] and info["step"] == 2 and not info["finished"]
