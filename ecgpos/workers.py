"""Worker processes (DataLoader workers, preprocessing workers): how many a machine can serve, and
how a DataLoader worker outlives a SIGTERM meant for the trainer that started it.

Slurm (scancel, preemption, a time limit) sends SIGTERM to every process of a job. The trainer
handles it (it checkpoints at its next step), but a worker killed by it first takes the trainer down
with it (torch: "DataLoader worker ... killed by signal"). So a worker ignores a SIGTERM that another
process sends and ends on the one its parent sends when it shuts the workers down. Only `sigwaitinfo` tells
who sent a signal: the signal is blocked in the worker and a thread waits for it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def max_workers() -> int:
    """The most worker processes (DataLoader workers, preprocessing workers) a process may start: 4 per
    usable CPU, and never fewer than 16, so the shipped settings run on a laptop; more only multiplies
    processes (a fork bomb at worst)."""
    return max(16, 4 * usable_cpus())


def outlive_others_sigterm(*_: object) -> None:
    """Call first thing in a worker process (a DataLoader `worker_init_fn`, a Pool initializer), while
    it has one thread: from then on only its parent's SIGTERM ends it. Where the OS has no
    sigwaitinfo (macOS, Windows) nothing changes."""
    if not hasattr(signal, "sigwaitinfo"):
        return
    parent = multiprocessing.parent_process()
    parent_pid = parent.pid if parent is not None else os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit the mask
    threading.Thread(target=_end_on_parents_sigterm, args=(parent_pid,), name="sigterm", daemon=True).start()


def _end_on_parents_sigterm(parent_pid: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent_pid:
            os._exit(0)  # what torch's worker handler does on its parent's SIGTERM: nothing is left to save
