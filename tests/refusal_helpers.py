"""Shared by the refusal tests: in-process CLI runs, one-line error checks, broken copies of real
records, and a tiny real run with its export."""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest
import torch
from pretrain_helpers import TINY0

from ecgpos.cli import main

torch.set_num_threads(1)
FAST = ["--set", "optim.steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"]
ROOT = Path(__file__).resolve().parents[1]
PRETRAIN = ["pretrain", "--level", "0", "--config", str(TINY0)]


def ctrl_c_when_renaming(monkeypatch, name: str) -> None:
    """Ctrl-C at the moment a write renames a file called `name` into place (os.replace raises
    KeyboardInterrupt there); `monkeypatch.undo()` ends it."""
    replace = os.replace

    def interrupted(src, dst):
        if Path(dst).name == name:
            raise KeyboardInterrupt
        replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def one_line_error(rc: int, err: str, command: str, needle: str = "") -> str:
    """rc 2, exactly one stderr line `ecgpos COMMAND: error: ...` (no traceback) containing needle."""
    lines = [line for line in err.strip().splitlines() if "warning" not in line]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"ecgpos {command}: error:"), err
    assert needle in lines[0], lines[0]
    return lines[0]


def read_rows(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def copy_record(real: Path, folder: Path, new_id: str, header_edit=None) -> Path:
    """A copy of a real WFDB record under a new name, its header optionally edited (text -> text)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = real.with_suffix(".hea").read_text().replace(real.name, new_id)
    if header_edit:
        text = header_edit(text)
    (folder / f"{new_id}.hea").write_text(text)
    shutil.copyfile(real.with_suffix(".mat"), folder / f"{new_id}.mat")
    return folder / new_id


def set_rate(text: str, rate: str) -> str:
    lines = text.splitlines(keepends=True)
    fields = lines[0].split(" ")
    fields[2] = rate
    return " ".join(fields) + "".join(lines[1:])


def unprivileged() -> list[str]:
    """A command prefix under which folder permissions apply (root reads any folder unless it drops
    the capabilities that let it)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: folder permissions cannot be tested")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
