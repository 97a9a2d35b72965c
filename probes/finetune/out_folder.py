"""What `ecgpos finetune` finds in its --out: it writes there only its own files (the probe's RUN_FILES,
config.yaml and models/), so a folder holding another command's results or files it does not own is one line
before anything is loaded, and model folders of an earlier run that this run does not list are named."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path

from ecgpos.export.finetuned_format import MODELS_DIR, model_folders
from ecgpos.probes.shared.out_folder import check_out_folder as check_shared
from ecgpos.probes.shared.provenance import RUN_FILES

OWN_FILES = frozenset((*RUN_FILES, "config.yaml", MODELS_DIR))


def check_out_folder(out: Path, kept: Collection[str] = ()) -> None:
    """EcgposError (one line) when --out holds another command's results or files finetune does not write
    (ecgpos.probes.shared.out_folder); `kept`: entries this run keeps there (a cache folder inside --out)."""
    check_shared(out, "finetune", OWN_FILES, kept=kept)


def earlier_models(out: Path, listed: Iterable[Path]) -> list[str]:
    """The model folders (models/<task>/<fraction>/seed<S> with a model.json) of an earlier run that `listed`,
    this run's, does not hold: kept, and still selectable by `export --classifier`."""
    ours = {Path(p).resolve() for p in listed}
    return [str(p.relative_to(out)) for p in model_folders(out) if p.resolve() not in ours]
