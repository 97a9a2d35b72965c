"""Worker processes under a job-wide SIGTERM (ecgpos.workers), in a real spawn Pool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

POOL_UNDER_A_JOB_WIDE_SIGTERM = """
import multiprocessing, os, subprocess
from ecgpos.workers import outlive_others_sigterm

if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1, initializer=outlive_others_sigterm) as pool:
        worker = pool.apply(os.getpid)
        subprocess.run(["kill", "-TERM", str(worker)], check=True)  # another process's SIGTERM: Slurm's
        print("same worker" if pool.apply(os.getpid) == worker else "another worker", flush=True)
    # leaving the block terminated the pool: the parent's SIGTERM ended the worker, and the join returned
    print("pool closed", flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="sigwaitinfo tells a signal's sender on Linux")
def test_a_pool_worker_outlives_a_sigterm_from_others_and_ends_on_its_parents(tmp_path: Path) -> None:
    """A worker killed by a job-wide SIGTERM while it holds the task queue's lock blocks the pool's
    shutdown for ever, and one killed mid-task takes its task with it; the parent alone handles it."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_UNDER_A_JOB_WIDE_SIGTERM)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["same worker", "pool closed"], done.stdout
