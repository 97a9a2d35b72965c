"""Two machines on one host through the launch line slurm/pretrain.sbatch renders (machine ranks 0 and 1,
head 127.0.0.1, CPU, gloo): they meet at the rendezvous, train what one machine with two processes
trains, checkpoint once, end together when one of them dies, and the requeued pair resumes exactly."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from pretrain_helpers import TINY0, metrics, weights

REPO = Path(__file__).resolve().parents[1]
SETTINGS = "optim.steps=8 train.checkpoint_every=2 train.batch_size=8 train.num_workers=0 train.log_every=1"
CHECKPOINT_FILES = ["model.safetensors", "optimizer.bin", "random_states_0.pkl", "random_states_1.pkl"]

pytestmark = pytest.mark.slow


def _job_id_with_free_port() -> int:
    """A job id whose port (slurm/common.sh: 20000 + id % 20000) is free on the loopback now."""
    for job in range(os.getpid() % 19000, 20000):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 20000 + job))
            except OSError:
                continue
            return job
    raise RuntimeError("no free port in 20000-39999")


def _launch_line(tmp_path: Path, shards: Path, runs: Path, nodes: int, gpus: int) -> str:
    """The per-node command (`bash -c` string) pretrain.sbatch gives srun, rendered by its dry run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ECGPOS_"))}
    env.update(
        SLURM_JOB_ID=str(_job_id_with_free_port()),
        SLURM_NNODES=str(nodes),
        SLURM_JOB_NODELIST="127.0.0.1",
        ECGPOS_GPUS_PER_NODE=str(gpus),
        ECGPOS_DRY_RUN="1",
        ECGPOS_WORK=str(tmp_path),
        ECGPOS_SHARDS=str(shards),
        ECGPOS_RUNS=str(runs),
        ECGPOS_LEVEL0_CONFIG=str(TINY0),
        ECGPOS_PRETRAIN_SET=SETTINGS,
    )
    proc = subprocess.run(
        ["bash", str(REPO / "slurm" / "pretrain.sbatch"), "0"], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    srun = shlex.split(proc.stdout)
    assert srun[0] == "srun" and f"--nodes={nodes}" in srun and srun[-3:-1] == ["bash", "-c"]
    return srun[-1]


def _machine(line: str, rank: int, bin_dir: Path) -> subprocess.Popen:
    """One node's task as srun starts it: the launch line with its $SLURM_PROCID, in a session of its own."""
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_PROCID": str(rank),
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": "",  # CPU and gloo, also on a host with a GPU
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        ["bash", "-c", line],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _finish(procs: list[subprocess.Popen], timeout: float = 300) -> list[tuple[int, str]]:
    out = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            text, _ = proc.communicate()
            pytest.fail(f"a machine hung:\n{text[-3000:]}")
        out.append((proc.returncode, text))
    return out


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`accelerate` on PATH, as on a cluster node: this interpreter's accelerate CLI."""
    folder = tmp_path_factory.mktemp("bin")
    script = folder / "accelerate"
    script.write_text(
        f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "from accelerate.commands.accelerate_cli import main; '
        f'main()" "$@"\n'
    )
    script.chmod(0o755)
    return folder


def _optimizer(run: Path) -> dict:
    from ecgpos.runs.run_folder import newest_checkpoint

    return torch.load(newest_checkpoint(run) / "optimizer.bin", weights_only=True)


def _same_tensors(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same_tensors, a, b))
    return a == b


def _losses(run: Path) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(run) if "loss" in r]


def _same_run(a: Path, b: Path) -> None:
    """Same weights, optimizer state and logged losses, bit for bit."""
    assert all(torch.equal(x, weights(b)[k]) for k, x in weights(a).items())
    assert _same_tensors(_optimizer(a), _optimizer(b))
    assert _losses(a) == _losses(b)


def test_two_machines_through_the_sbatch_launch_line(tmp_path: Path, shards: Path, bin_dir: Path) -> None:
    # one machine, two processes: the reference
    one = _launch_line(tmp_path, shards, tmp_path / "one", nodes=1, gpus=2)
    [(rc, text)] = _finish([_machine(one, 0, bin_dir)])
    assert rc == 0, text[-3000:]

    two = _launch_line(tmp_path, shards, tmp_path / "two", nodes=2, gpus=0)
    assert "--machine_rank $SLURM_PROCID" in two and "--main_process_ip 127.0.0.1" in two
    done = _finish([_machine(two, rank, bin_dir) for rank in (0, 1)])
    assert [rc for rc, _ in done] == [0, 0], done[0][1][-3000:] + done[1][1][-3000:]
    run = tmp_path / "two" / "level0"
    info = json.loads((run / "run_info.json").read_text())
    assert info["finished"] is True and (info["num_processes"], info["global_batch"]) == (2, 8)  # they met
    # only the main process (machine 0) logs and writes: one log line per step, one checkpoint per save
    assert "step 8/8 loss" in done[0][1] and "step 8/8 loss" not in done[1][1]
    assert [r["step"] for r in metrics(run) if "loss" in r] == [1, 2, 3, 4, 5, 6, 7, 8]
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert checkpoints == ["step-0000006", "step-0000008"]  # keep_checkpoints 2; nothing half-written
    newest = run / "checkpoints" / "step-0000008"
    assert sorted(p.name for p in newest.iterdir()) == sorted([*CHECKPOINT_FILES, "trainer_state.json"])
    assert len(json.loads((newest / "trainer_state.json").read_text())["rng"]) == 2
    _same_run(run, tmp_path / "one" / "level0")

    # machine 1 dies after the first checkpoint: machine 0 ends too, and the requeued pair resumes exactly
    killed = _launch_line(tmp_path, shards, tmp_path / "killed", nodes=2, gpus=0)
    procs = [_machine(killed, rank, bin_dir) for rank in (0, 1)]
    first = tmp_path / "killed" / "level0" / "checkpoints" / "step-0000002"
    deadline = time.monotonic() + 240
    while not first.is_dir() and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.005)  # a step takes ~0.1 s: machine 1 is stopped within the next few
    # the machine, not one process: torchrun starts its trainer in a session of its own
    machine1 = [psutil.Process(procs[1].pid), *psutil.Process(procs[1].pid).children(recursive=True)]
    for proc in machine1:
        proc.suspend()  # machine 0 now waits for it in the next step's all-reduce
    assert (first / "trainer_state.json").is_file(), _finish(procs)[0][1][-3000:]
    for proc in machine1:
        proc.kill()
    started = time.monotonic()
    (rc0, text0), _ = _finish(procs, timeout=120)
    assert rc0 != 0 and "step 8/8" not in text0 and time.monotonic() - started < 120, text0[-3000:]
    assert not (tmp_path / "killed" / "level0" / "run_info.json").is_file() or not json.loads(
        (tmp_path / "killed" / "level0" / "run_info.json").read_text()
    ).get("finished")
    done = _finish([_machine(killed, rank, bin_dir) for rank in (0, 1)])
    assert [rc for rc, _ in done] == [0, 0], done[0][1][-3000:] + done[1][1][-3000:]
    resumed = json.loads((tmp_path / "killed" / "level0" / "run_info.json").read_text())
    assert resumed["finished"] is True and "resumed_from" in resumed
    _same_run(tmp_path / "killed" / "level0", run)
