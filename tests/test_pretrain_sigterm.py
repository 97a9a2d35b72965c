"""`ecgpos pretrain` with loader workers under a SIGTERM to its whole process group, as Slurm sends it
(scancel, preemption): the workers get it too, yet the trainer alone acts on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pretrain_helpers import FAST, TINY0, max_diff, metrics, pretrain, weights

from ecgpos.runs.run_folder import list_checkpoints, newest_checkpoint

# run0's settings (tests/conftest.py), with two persistent loader workers: the same 40 steps
FLAGS = ["--set", "optim.steps=40", "--set", "train.checkpoint_every=20", "--set", "train.figure_every=20"]
WORKERS = ["--set", "train.num_workers=2"]


def forked_children(pid: int) -> list[int]:
    """Children of `pid` still running its own program: forked, not (yet) another command."""
    own = Path(f"/proc/{pid}/cmdline").read_bytes()
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
            found += [int(c) for c in children if Path(f"/proc/{c}/cmdline").read_bytes() == own]
        except OSError:  # a thread or a child that just ended
            continue
    return found


def workers_starting(run: Path, pid: int) -> bool:
    """The loader's workers are being forked: the last processes the trainer starts, after the run files."""
    return (run / "config.yaml").exists() and bool(forked_children(pid))


def steps_running(run: Path, pid: int) -> bool:  # noqa: ARG001
    """Three steps of the six of an epoch logged (log_every 1)."""
    return (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3


def checkpoint_started(run: Path, pid: int) -> bool:  # noqa: ARG001
    """The step-20 checkpoint is being written (its .tmp folder) or has just been."""
    return (run / "checkpoints").exists() and any((run / "checkpoints").iterdir())


@pytest.mark.skipif(sys.platform != "linux", reason="reads the trainer's children from /proc")
@pytest.mark.parametrize("moment", [workers_starting, steps_running, checkpoint_started], ids=lambda f: f.__name__)
def test_a_job_wide_sigterm_stops_pretrain_with_a_checkpoint_it_resumes_exactly(
    moment, shards: Path, run0: Path, tmp_path: Path
) -> None:
    """A worker that died of the group's SIGTERM while it started took the trainer down with a
    traceback ("DataLoader worker ... exited unexpectedly", exit 1): Slurm's script does not requeue
    that. Now: exit 0, one line naming the checkpoint, no process of the group left, and the resumed
    run ends as the uninterrupted one (the same losses, the same weights)."""
    run = tmp_path / "run"
    args = ["pretrain", "--level", "0", "--config", TINY0, "--shards", shards, "--run-dir", run, *FAST, *FLAGS]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ecgpos", *map(str, args), *WORKERS],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a Slurm job step
    )
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not moment(run, proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.02)  # a worker's first tens of milliseconds: torch's start-up, before worker_init_fn
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err, err[-2000:]
    with pytest.raises(ProcessLookupError):  # no worker is left behind
        os.killpg(proc.pid, 0)
    stopped = json.loads((run / "run_info.json").read_text())["step"]
    said = [line for line in out.splitlines() if "stopped by" in line]
    assert said == [
        f"ecgpos pretrain: stopped by SIGTERM at step {stopped}; checkpoint {newest_checkpoint(run)} saved, "
        "continue with --resume auto"
    ]
    assert list_checkpoints(run)[-1][0] == stopped < 40
    # resumed in this process without workers (the data is a function of the step alone): a loader's
    # workers outlive a run in-process until a garbage collection, whose shutdown of them takes seconds
    assert pretrain(0, shards, run, *FLAGS, "--resume", "auto") == 0
    straight, resumed = metrics(run0), metrics(run)
    assert [r["step"] for r in resumed] == [r["step"] for r in straight] == list(range(1, 41))
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], abs=1e-6)
    assert max_diff(weights(run), weights(run0)) <= 1e-6


def test_a_sigterm_before_training_starts_is_one_line_and_exit_143(shards: Path, tmp_path: Path) -> None:
    """Until the trainer installs its handler (imports, config and shard checks, the Accelerator) a
    SIGTERM ended pretrain with the default action: exit -15 and not a word. Now it stops as every
    other command does: one `terminated:` line, exit 143, and the rerun of the same command trains."""
    run = tmp_path / "run"
    args = ["pretrain", "--level", "0", "--config", TINY0, "--shards", shards, "--run-dir", run, *FAST]
    proc = subprocess.Popen(
        [sys.executable, "-m", "ecgpos", *map(str, args), "--set", "optim.steps=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(1.0)  # the interpreter is up and the command's imports are running (they take seconds)
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    assert "Traceback" not in err and [line for line in err.splitlines() if "terminated:" in line] == [
        "ecgpos pretrain: terminated: no partial output was kept; run the same command again"
    ], err
    assert not run.exists() or not list_checkpoints(run)
    assert pretrain(0, shards, run, "--set", "optim.steps=2") == 0
