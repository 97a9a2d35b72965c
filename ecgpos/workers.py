"""Worker processes (DataLoader workers, preprocessing workers): how many a machine can serve, and
how they outlive a SIGTERM or Ctrl-C meant for the command that started them.

Slurm (scancel, preemption, a time limit) sends SIGTERM to every process of a job, and Ctrl-C sends
SIGINT to the terminal's whole process group. The command that started the workers handles it (the
trainer checkpoints at its next step; `preprocess` stops with one line); a worker killed by it first
takes the command down with it (torch: "DataLoader worker ... killed by signal") or hangs it (a pool
worker killed while it holds a queue's lock). So a DataLoader worker ignores a SIGTERM that another
process sends and ends on the one its parent sends when it shuts the workers down. Only `sigwaitinfo`
tells who sent a signal: the signal is blocked in the worker, from its birth on, and a thread waits
for it. Workers of `mapped_in_workers` are born with both signals blocked and end when their parent
tells them to (or kills them), once it has taken the signal (it defers its own handler until then).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, wait
from multiprocessing import resource_tracker
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

STOPS = (signal.SIGINT, signal.SIGTERM)
POLL_S = 0.05
"""How often the parent, waiting for a result, looks whether a stop signal came."""


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


class _Stop(BaseException):
    """A deferred stop signal came: leave the block (BaseException: no `except Exception` keeps it)."""


class DeferredStops:
    """Inside, SIGINT and SIGTERM only note that they came; on leaving, the noted signal goes to the
    handler it replaced (Ctrl-C's KeyboardInterrupt, the CLI's `terminated:`). A handler that raises
    wherever the signal lands can raise inside a pool's bookkeeping (a lock half taken; a weakref
    callback, which drops it) and hang or lose the stop, or inside an import, after which CPython may
    end the process by SIGINT whatever its exit code. The block looks for the note with `check()` at
    moments of its choosing. Handlers are the main thread's alone: elsewhere nothing changes."""

    def __init__(self) -> None:
        self.previous: dict[int, Any] = {}
        self.received: int | None = None

    def __enter__(self) -> DeferredStops:
        if threading.current_thread() is threading.main_thread():
            for sig in STOPS:
                if signal.getsignal(sig) not in (signal.SIG_IGN, None):  # an ignored signal stays ignored
                    self.previous[sig] = signal.signal(sig, self._note)
        return self

    def _note(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        if self.received is None:
            self.received = signum

    def check(self) -> None:
        """Raise (a BaseException that leaves the block) if a stop signal came."""
        if self.received is not None:
            raise _Stop

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self.received is not None:
            signal.raise_signal(self.received)  # its handler runs now, in this thread
            if exc_type is _Stop:  # a handler that does not raise: stop as Ctrl-C does
                raise KeyboardInterrupt


@contextlib.contextmanager
def _blocked(signals: Iterable[int]) -> Iterator[None]:
    """`signals` blocked in this thread inside the block; one that comes meanwhile waits until it ends.
    Processes and threads started inside inherit the mask (it survives fork and exec)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def _born_with_stops_blocked() -> Iterator[None]:
    """Processes and threads started inside begin with SIGINT and SIGTERM blocked, so neither can end
    a worker still starting up, before any initializer runs. Pending in a worker, it stays so."""
    if not hasattr(signal, "pthread_sigmask"):  # Windows
        yield
        return
    resource_tracker.ensure_running()  # it unblocks both signals after starting its own process
    with _blocked(STOPS):
        yield


@contextlib.contextmanager
def born_with_sigterm_blocked() -> Iterator[None]:
    """DataLoader workers started (forked) inside begin with SIGTERM blocked, until their
    `worker_init_fn` (`outlive_others_sigterm`) takes it over. torch's worker start-up installs a
    SIGTERM handler that dies of anyone's signal tens of milliseconds before that function runs, so a
    job-wide SIGTERM then killed a starting worker, and the trainer with it. Blocked, the signal waits
    for the function's thread, which drops it. Where the OS has no sigwaitinfo nothing changes: no
    thread would take a blocked SIGTERM, and the worker would outlive its parent's too."""
    if not hasattr(signal, "sigwaitinfo"):
        yield
        return
    with _blocked({signal.SIGTERM}):
        yield


def _start_worker(initializer: Callable[..., object] | None, initargs: Sequence[object]) -> None:
    """SIGINT and SIGTERM stay blocked, as they were at birth; the parent's SIGTERM (the executor sends
    one only when a worker died and the pool is broken) still ends the worker."""
    outlive_others_sigterm()
    if initializer is not None:
        initializer(*initargs)


def _in_order(futures: deque[Future], deferred: DeferredStops) -> Iterator[Any]:
    while futures:
        deferred.check()
        if wait((futures[0],), timeout=POLL_S).done:
            yield futures.popleft().result()


@contextlib.contextmanager
def mapped_in_workers(
    fn: Callable[[T], R],
    items: Iterable[T],
    workers: int,
    initializer: Callable[..., object] | None = None,
    initargs: Sequence[object] = (),
    finish_running: bool = True,
) -> Iterator[Iterator[R]]:
    """`fn(item)` for each item in `workers` spawned processes (safe with h5py handles and threads,
    the same on Linux and macOS), results in order. Ctrl-C and SIGTERM, even sent to every process of
    the group while workers start, are the parent's alone: the block stops at the next result, waits
    for the tasks already running (or, with `finish_running` False, for tasks whose unfinished work is
    worth nothing and may run for minutes, kills the workers), and the signal's handler then takes over
    (KeyboardInterrupt, `terminated:`). Workers end on a word or a kill from the parent, never on
    another's signal, so none is left behind."""
    with DeferredStops() as deferred:
        executor = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(initializer, tuple(initargs)),
        )
        try:
            with _born_with_stops_blocked():  # the first `workers` submits start the workers
                futures = deque(executor.submit(fn, item) for item in items)
            yield _in_order(futures, deferred)
        finally:
            if deferred.received is not None and not finish_running:
                _kill_workers(executor)
            executor.shutdown(wait=True, cancel_futures=True)


def _kill_workers(executor: ProcessPoolExecutor) -> None:
    """SIGKILL, not the parent's SIGTERM: a worker still starting holds a job-wide SIGTERM pending, and
    the parent's, merged into it, would look like another's. The executor then finds its pool broken and
    ends it; no future is read after that. (Python 3.14's executor has kill_workers() for this.)"""
    for process in list(executor._processes.values()):  # noqa: SLF001
        process.kill()
