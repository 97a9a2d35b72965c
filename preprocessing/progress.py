"""Progress of a preprocessing run: a bar on a terminal, plain lines in a log."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """A tqdm bar on a terminal; otherwise one plain line per finished shard."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.stream, self.total, self.done, self.start = stream, total, 0, time.monotonic()
        self.bar = None
        if stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="rec", file=stream, desc="preprocess")

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)

    def chunk_done(self, chunk: int, stored: int, skipped: int) -> None:
        if self.bar is None:
            rate = self.done / max(time.monotonic() - self.start, 1e-9)
            print(
                f"ecgpos preprocess: chunk {chunk}: stored {stored}, skipped {skipped} "
                f"({self.done}/{self.total} records, {rate:.0f} rec/s)",
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
