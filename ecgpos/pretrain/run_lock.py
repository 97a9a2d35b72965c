"""One trainer per run folder: a second `ecgpos pretrain` into a folder that another one is writing
(a job submitted twice, a rerun while the first is still queued-and-running) is refused in one line,
instead of two trainers interleaving checkpoints and metrics.

The lock is a POSIX record lock (`lockf`) on `RUN_DIR/.lock`, taken by the main process only. It
belongs to that process: forked loader workers do not hold it, and the kernel releases it when the
process exits, however it exits (SIGKILL, preemption), so a requeued or resumed run never finds a
stale lock. Network file systems (NFS, Lustre with locking) carry POSIX locks across nodes; one
mounted without lock support gives a warning and the run goes on unguarded.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from ecgpos.errors import ConfigError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_folder_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run folder's lock inside the block; ConfigError when another process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _lock(fd, run_dir)
        yield
    finally:
        os.close(fd)  # releases the lock (any close of the file by this process would)


def _lock(fd: int, run_dir: Path) -> bool:
    """True when this process now holds the lock; False (warned) on a file system without locks."""
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EACCES, errno.EAGAIN):
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"{run_dir} is being written by another ecgpos pretrain ({holder}): wait for it or stop it"
            ) from None
        print(f"ecgpos pretrain: warning: cannot lock {run_dir} ({err.strerror}); not guarded", file=sys.stderr)
        return False
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return True
