"""Ctrl-C and SIGTERM sent to the whole process group (a terminal; Slurm before a requeue or at a time
limit) while the worker processes of `ecgpos probe --workers` and of the demo's simulation start or run:
one line and exit code as without workers, no traceback, no process left behind, and the rerun gives
the results of an uninterrupted run."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ecgpos.cli import main
from ecgpos.demo.synthetic import random_params, simulate, simulate_many

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads process groups from /proc")

ANSWERS = {signal.SIGTERM: (143, "terminated"), signal.SIGINT: (130, "interrupted")}


def _start(*args: object) -> subprocess.Popen:
    """`ecgpos ARGS` in a process group of its own (as a terminal or Slurm runs it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "ecgpos.cli", *map(str, args)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _running_in_group(pgid: int) -> dict[int, str]:
    """pid -> command line of the processes of a group that still run (zombies aside)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
            if int(group) == pgid and state != "Z":
                found[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def _children(pid: int) -> dict[str, bytes]:
    """pid -> command line of a process's children."""
    found = {}
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                found[child] = Path(f"/proc/{child}/cmdline").read_bytes()
    return found


def _workers_started(proc: subprocess.Popen) -> bool:
    """Whether the command has a pool worker: a child spawned by multiprocessing, or one forked from it
    that is still the command a moment later (not a subprocess between its fork and its exec)."""
    children = _children(proc.pid)
    if any(b"spawn_main" in cmd for cmd in children.values()):
        return True
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        if command in children.values():
            time.sleep(0.02)
            return any(cmd == command for cmd in _children(proc.pid).values())
    return False


def _stop_once_workers_start(proc: subprocess.Popen, sig: int, delay: float) -> str:
    """Send `sig` to the group `delay` s after the first worker appears; stderr of the stopped command,
    checked for the one line of `code` and no traceback, with no process of the group left."""
    deadline = time.monotonic() + 120
    while not _workers_started(proc) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    assert proc.poll() is None, f"no worker started: {proc.communicate()[1][-2000:]}"
    time.sleep(delay)
    os.killpg(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        left = _running_in_group(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the command hung after the signal: {left}")
    code, said = ANSWERS[sig]
    assert proc.returncode == code, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err and "leaked" not in err, err[-3000:]
    assert f": {said}: " in err.strip().splitlines()[-1], err[-3000:]
    deadline = time.monotonic() + 5  # the resource tracker ends when its parent has
    while _running_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _running_in_group(proc.pid) == {}
    return err


# The least work `ecgpos probe` trains in worker processes (ecgpos.probes.linear.run.SPAWN_MIN_STEPS: 20,000 probe
# steps; here 2 jobs of 62 + 124 PTB-XL rows, batch 1, 120 epochs), on the features of a random encoder.
PROBE = ["--encoder", "random:tiny/level0", "--task", "ptbxl-super", "--fractions", "50,100", "--seeds", "1"]
PROBE += ["--epochs", "120", "--set", "protocol.batch_size=1", "--bootstrap", "0"]


def _probe_args(shared_data: Path, cache: Path, out: Path, workers: int) -> list[str]:
    args = ["probe", *PROBE, "--data-root", shared_data, "--splits", shared_data / "merl_splits"]
    return [str(a) for a in (*args, "--workers", workers, "--cache-dir", cache, "--out", out)]


@pytest.fixture(scope="module")
def probed(shared_data: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """(feature cache, results.csv) of an uninterrupted run, in this process."""
    folder = tmp_path_factory.mktemp("probed")
    assert main(_probe_args(shared_data, folder / "cache", folder / "out", 1)) == 0
    return folder / "cache", (folder / "out" / "results.csv").read_bytes()


# (signal, seconds after the first worker appears, --workers of the rerun): while the pool starts, while
# its workers import torch, while they train (on a loaded machine maybe still importing); one rerun uses
# the pool again, the others train in this process, which is quicker and gives the same rows
STOPS = [(signal.SIGTERM, 0.0, 2), (signal.SIGINT, 0.5, 1), (signal.SIGTERM, 4.0, 1)]


@pytest.mark.parametrize(("sig", "delay", "rerun_workers"), STOPS)
def test_probe_workers_stopped_by_a_signal_to_the_group(shared_data, tmp_path, probed, sig, delay, rerun_workers):
    """A stop used to raise inside the pool's start-up (`RuntimeError: cannot join thread before it is
    started`, exit 1), and Ctrl-C printed each starting worker's KeyboardInterrupt traceback. The features
    are cached already, so the signal lands while the probes' workers start or train."""
    cache, out = tmp_path / "cache", tmp_path / "out"
    shutil.copytree(probed[0], cache)
    err = _stop_once_workers_start(_start(*_probe_args(shared_data, cache, out, 2)), sig, delay)
    assert err.strip().splitlines()[-1].endswith(f"cached in {cache}; the same command reuses them"), err
    assert [p.name for folder in (cache, out) for p in folder.glob(".*")] == []
    assert main(_probe_args(shared_data, cache, out, rerun_workers)) == 0
    assert (out / "results.csv").read_bytes() == probed[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_demo_simulation_workers_stopped_by_a_signal_to_the_group(tmp_path, sig) -> None:
    """The demo's first step simulates its corpora in worker processes; a stop there is one line (the
    rerun simulates them again: nothing is written before all are simulated)."""
    err = _stop_once_workers_start(_start("demo", "--quick", "--out", tmp_path / "demo"), sig, 0.0)
    assert err.strip().splitlines()[-1] == f"ecgpos demo: {ANSWERS[sig][1]}: {NOTHING_KEPT}", err
    assert not (tmp_path / "demo" / "raw").exists()


NOTHING_KEPT = "no partial output was kept; run the same command again"


def test_simulated_in_workers_as_in_this_process() -> None:
    """The records the demo simulates in worker processes are those simulated one by one."""
    params = random_params(2, seed=5)
    assert all((a == b).all() for a, b in zip(simulate_many(params, workers=2), map(simulate, params), strict=True))


STOPPED_WHILE_A_TASK_RUNS = """
import signal, time
from ecgpos.workers import mapped_in_workers

def stop(signum, frame):  # what the CLI's SIGTERM handler does
    raise KeyboardInterrupt

if __name__ == "__main__":
    signal.signal(signal.SIGTERM, stop)
    try:
        with mapped_in_workers(time.sleep, [0, 60], 1, finish_running=False) as slept:
            next(slept)
            print("the second task runs", flush=True)
            running = time.monotonic()
            next(slept)
    except KeyboardInterrupt:
        print(f"{time.monotonic() - running:.1f}", flush=True)
"""


def test_mapped_in_workers_without_finish_running_ends_the_running_task_on_a_stop(tmp_path: Path) -> None:
    """A probe's training may run for minutes and nothing of it is kept: a job-wide SIGTERM ends it at
    once (Slurm's SIGKILL follows 30 s later by default), and no worker outlives the command."""
    script = tmp_path / "stopped.py"
    script.write_text(STOPPED_WHILE_A_TASK_RUNS)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "the second task runs\n"
    time.sleep(0.2)  # the worker has taken the task
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 0 and float(out) < 10, out  # not the task's 60 s
    deadline = time.monotonic() + 5  # the resource tracker ends when its parent has
    while _running_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _running_in_group(proc.pid) == {}
