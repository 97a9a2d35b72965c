"""What `ecgpos probe`, `probe --compare`, `finetune` and `geometry` find in their --out: each writes
there only its own files, so a folder holding another command's results, or files the command does not
write, is one line before anything is loaded or deleted. Which command wrote a folder is read from its
probe.json (fine-tuning records a mode, a --compare the folders it compared) or, for geometry, which
writes no probe.json, from the files only geometry writes. Hidden files (".lock", temporaries) are
never counted."""

from __future__ import annotations

import json
import sys
from collections.abc import Collection
from pathlib import Path

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.provenance import INFO_FILE

GEOMETRY_FILES = ("metrics.csv", "features.npz", "summary.md", "geometry.png", "depth.png")
"""What `ecgpos geometry` writes into --out; metrics.csv and features.npz mark a geometry folder."""
_GEOMETRY_MARKS = ("metrics.csv", "features.npz")


def writer(out: Path) -> tuple[str, str] | None:
    """(command, the file that says so) of the results `out` holds: `finetune`, `probe --compare` or
    `probe` by its probe.json, `geometry` by its metrics.csv or features.npz; None when neither is there
    (or probe.json is unreadable: its files are then judged by name alone)."""
    try:
        info = json.loads((out / INFO_FILE).read_text())
    except (OSError, ValueError):
        info = None
    if isinstance(info, dict):
        return ("finetune" if "mode" in info else "probe --compare" if "compared" in info else "probe"), INFO_FILE
    mark = next((name for name in _GEOMETRY_MARKS if (out / name).is_file()), None)
    return ("geometry", mark) if mark else None


def check_out_folder(
    out: Path, command: str, own: Collection[str], writers: Collection[str] = (), kept: Collection[str] = ()
) -> None:
    """EcgposError (one line) when --out `out` holds the results of a command other than `command` (or
    than `writers`, the commands whose folders this one may write into) or files that are neither `own`
    (what `command` writes there) nor `kept` (entries this run keeps, e.g. a cache folder inside --out,
    named on stderr when present). Nothing is read beyond names and probe.json; nothing is changed."""
    if not out.is_dir():
        return
    found = writer(out)
    if found is not None and found[0] not in (command, *writers):
        raise EcgposError(
            f"--out {out} holds the results of `ecgpos {found[0]}` ({found[1]}): "
            f"give `ecgpos {command}` a folder of its own"
        )
    names = [p.name for p in out.iterdir() if not p.name.startswith(".")]
    foreign = sorted(n for n in names if n not in own and n not in kept)
    if foreign:
        more = " ..." if len(foreign) > 3 else ""
        raise EcgposError(
            f"--out {out} holds files `ecgpos {command}` does not write ({', '.join(foreign[:3])}{more}): "
            f"give `ecgpos {command}` a new or empty folder, or move them out"
        )
    here = sorted(n for n in names if n in kept)
    if here:
        print(f"ecgpos {command}: keeping {', '.join(str(out / n) for n in here)} in --out", file=sys.stderr)


def kept_inside(out: Path, folder: Path) -> list[str]:
    """The entry of `out` that holds `folder` (e.g. --cache-dir OUT/cache: ["cache"]); [] when `folder`
    lies outside `out`."""
    try:
        rel = folder.resolve().relative_to(out.resolve())
    except ValueError:
        return []
    return list(rel.parts[:1])
