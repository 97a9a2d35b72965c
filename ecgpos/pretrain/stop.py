"""Stop requests of a pretraining run: SIGUSR1/SIGTERM (a scheduler's warning) and Ctrl-C.

The first of these signals only sets a flag; the trainer then writes a checkpoint at the next step
boundary and exits (ecgpos.pretrain.trainer). A second Ctrl-C does not wait for that: it raises
KeyboardInterrupt at once, and the newest checkpoint on disk is what a resume continues from.
DataLoader workers are forked while the handlers are installed and inherit them
(ecgpos.pretrain.data.WORKER_START), so a signal to the whole process group (a terminal's Ctrl-C,
Slurm) does not kill them under the trainer; SIGTERM, whose handler torch's worker start-up replaces,
they ignore unless the trainer sends it (ecgpos.workers).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The first stop signal received (`signum`, None while none came)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def _on_signal(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if signum == signal.SIGINT and self.signum is not None:
            raise KeyboardInterrupt  # Ctrl-C twice: the user does not want to wait for the checkpoint
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else "a signal on another process"

    @property
    def exit_code(self) -> int:
        """130 after Ctrl-C (the shell's code for SIGINT: `a && b` does not go on), else 0 (requeue)."""
        return 130 if self.signum == signal.SIGINT else 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequest]:
        """Handle the stop signals inside the block; the previous handlers come back after it.

        Handlers can only be installed from the main thread: a run started from another thread
        (e.g. a notebook worker) trains without them.
        """
        in_main = threading.current_thread() is threading.main_thread()
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS} if in_main else {}
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
