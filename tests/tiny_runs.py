"""Tiny pretraining runs through the CLI, as several test modules need them."""

from __future__ import annotations

from pathlib import Path

from ecgpos.cli import main


def pretrain_tiny(level: int, shards: Path, run_dir: Path, *extra: str, base: Path | None = None) -> Path:
    """`ecgpos pretrain` with the shipped tiny config of `level` (+ `extra` flags); asserts it finished."""
    args = ["pretrain", "--level", str(level), "--config", f"tiny/level{min(level, 1)}", "--shards", str(shards)]
    if base is not None:
        args += ["--base", str(base)]
    assert main([*args, "--run-dir", str(run_dir), *extra]) == 0
    return run_dir


def cli(*args: object) -> int:
    """`ecgpos ARGS...` in-process, each argument turned into a string (paths, numbers)."""
    return main([str(a) for a in args])
