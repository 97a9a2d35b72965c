"""What `ecgpos finetune` finds in its --out: it writes there only its own files (the probe's RUN_FILES,
config.yaml and models/), so a folder holding another command's results or files it does not own is one line
before anything is loaded, and model folders of an earlier run that this run does not list are named."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from ecgpos.errors import EcgposError
from probes.finetune.outputs import MODELS_DIR
from probes.shared.provenance import INFO_FILE, RUN_FILES

OWN_FILES = frozenset((*RUN_FILES, "config.yaml", MODELS_DIR))


def _writer(out: Path) -> str | None:
    """The command whose probe.json `out` holds: `finetune` (it records a mode), `probe --compare`, `probe`;
    None without a readable one."""
    try:
        info = json.loads((out / INFO_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict):
        return None
    return "finetune" if "mode" in info else "probe --compare" if "compared" in info else "probe"


def check_out_folder(out: Path) -> None:
    """EcgposError (one line) when --out holds another command's results or files finetune does not write."""
    if not out.is_dir():
        return
    writer = _writer(out)
    if writer not in (None, "finetune"):
        raise EcgposError(
            f"--out {out} holds the results of `ecgpos {writer}` ({INFO_FILE}): fine-tune into a folder of its own"
        )
    foreign = sorted(p.name for p in out.iterdir() if p.name not in OWN_FILES and not p.name.startswith("."))
    if foreign:
        more = " ..." if len(foreign) > 3 else ""
        raise EcgposError(
            f"--out {out} holds files `ecgpos finetune` does not write ({', '.join(foreign[:3])}{more}): "
            "fine-tune into a new or empty folder, or move them out"
        )


def earlier_models(out: Path, listed: Iterable[Path]) -> list[str]:
    """The model folders (models/<task>/<fraction>/seed<S> with a model.json) of an earlier run that `listed`,
    this run's, does not hold: kept, and still selectable by `export --classifier`."""
    ours = {Path(p).resolve() for p in listed}
    found = sorted(p.parent for p in (out / MODELS_DIR).glob("*/*/seed*/model.json"))
    return [str(p.relative_to(out)) for p in found if p.resolve() not in ours]
