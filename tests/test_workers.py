"""Worker processes under a job-wide SIGTERM or Ctrl-C (ecgpos.workers), in real spawned processes."""

from __future__ import annotations

import functools
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ecgpos.workers import DeferredStops, mapped_in_workers

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


@pytest.mark.skipif(sys.platform != "linux", reason="sigwaitinfo tells a signal's sender on Linux")
def test_mapped_in_workers_starts_workers_with_ctrl_c_and_sigterm_blocked_and_leaves_the_parent_as_it_was() -> None:
    """A worker still starting up (before any initializer runs) must not die of a Ctrl-C or SIGTERM sent
    to the whole process group. multiprocessing's resource tracker unblocks both signals in the parent
    when it first starts, which would leave the first workers unprotected."""
    before = (signal.pthread_sigmask(signal.SIG_BLOCK, []), signal.getsignal(signal.SIGINT))
    masks = functools.partial(signal.pthread_sigmask, signal.SIG_BLOCK)  # fn(item): the worker's mask
    with mapped_in_workers(masks, [[], []], 2) as results:
        assert [{signal.SIGINT, signal.SIGTERM} <= mask for mask in results] == [True, True]
    assert (signal.pthread_sigmask(signal.SIG_BLOCK, []), signal.getsignal(signal.SIGINT)) == before


def test_deferred_stops_hand_the_signal_to_the_handler_they_replaced_when_the_block_ends() -> None:
    """Inside the block Ctrl-C is only noted (a KeyboardInterrupt raised inside an import or a pool's
    bookkeeping can hang it or lose the stop); check() leaves the block, and leaving it raises Ctrl-C's
    own KeyboardInterrupt, with the handler back in place."""
    steps = []
    with pytest.raises(KeyboardInterrupt), DeferredStops() as deferred:
        deferred.check()
        signal.raise_signal(signal.SIGINT)
        steps.append("went on after the signal")
        deferred.check()
        steps.append("went on after check()")
    assert steps == ["went on after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
