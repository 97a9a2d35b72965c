"""Tiny pretraining runs through the CLI, as several test modules need them."""

from __future__ import annotations

from pathlib import Path

from ecgpos.cli import main


def pretrain_tiny(stage: int, shards: Path, run_dir: Path, *extra: str, stage0: Path | None = None) -> Path:
    """`ecgpos pretrain` with the shipped tiny config of `stage` (+ `extra` flags); asserts it finished."""
    args = ["pretrain", "--stage", str(stage), "--config", f"tiny/stage{stage}", "--shards", str(shards)]
    if stage0 is not None:
        args += ["--stage0", str(stage0)]
    assert main([*args, "--run-dir", str(run_dir), *extra]) == 0
    return run_dir


def cli(*args: object) -> int:
    """`ecgpos ARGS...` in-process, each argument turned into a string (paths, numbers)."""
    return main([str(a) for a in args])
