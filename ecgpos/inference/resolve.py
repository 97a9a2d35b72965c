"""Frozen encoders for downstream use, from a run folder, an export folder or a random init.

`resolve_encoder(x, level=None)` is the one entry point probes use: a training run folder (its newest
complete checkpoint), an export folder (ecgpos.export.load) or `hf://ORG/NAME[@REVISION]`
(ecgpos.export.hub), or 'random:<config.yaml>' (the random-init baseline), each as the one loaded-encoder
type ecgpos.export.load.ExportedEncoder; `level` cuts a nested encoder to its levels 0..level. Anything
unloadable raises EcgposError with one line.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torch import nn

from ecgpos.errors import EcgposError
from ecgpos.export.format import is_export_dir
from ecgpos.export.hub import is_hub_ref
from ecgpos.export.load import ExportedEncoder, load_encoder
from ecgpos.models.factory import random_init
from ecgpos.models.nested import SHARED_LAYOUT
from ecgpos.resources import config_path as config_path_of
from ecgpos.runs.run_config import RunConfig, load_run_config
from ecgpos.runs.run_folder import base_source, is_run_dir, load_run_model, read_trainer_state


def _freeze(module: nn.Module) -> nn.Module:
    module.requires_grad_(False)
    return module.eval()


def load_run_encoder(run_dir: str | Path) -> ExportedEncoder:
    """Encoder of a run's newest complete checkpoint: STMEMEncoder (level 0) or NestedEncoder (levels 0..N)."""
    from ecgpos.runs.levels import trainable_encoder

    model, cfg, checkpoint, info = load_run_model(run_dir)
    module = _freeze(trainable_encoder(model))
    step = read_trainer_state(checkpoint)["step"]
    details = {
        "level": cfg.level,
        "step": step,
        "checkpoint": str(checkpoint),
        "run_dir": str(Path(run_dir)),
        "steps": cfg.optim.steps,
        "finished": bool(info.get("finished", False)) and step >= cfg.optim.steps,
    }
    if cfg.level >= 1:
        details["base"] = base_source(info)
    return ExportedEncoder(module, cfg.preprocess, source=str(Path(run_dir)), info=details)


def unfinished_note(info: dict) -> str | None:
    """For an encoder from a run folder whose training has not finished: one line saying which
    checkpoint stands in for the trained model (None for finished runs, exports and random inits).
    info: a loaded encoder's info, or the training summary an export records (the same keys)."""
    if "run_dir" not in info or info.get("finished"):
        return None
    return (
        f"{info['run_dir']} is not finished (step {info.get('step', '?')} of {info.get('steps', '?')}): "
        f"its newest checkpoint {Path(str(info.get('checkpoint', ''))).name} is used"
    )


def random_encoder(config_path: str | Path, seed: int = 0) -> ExportedEncoder:
    """Randomly initialised encoder of a run config (the random-init baseline).

    A level-0 config gives an STMEMEncoder; a level-N config a NestedEncoder of N + 1 levels, each at
    its own configured size: Level 0 from the `level0.yaml` beside the config (configs/level0.yaml
    for configs/level1.yaml) when it has the same width and token layout, else from the config's
    encoder section; levels 1..N from the config's encoder section.
    """
    cfg = load_run_config(config_path)
    encoder = dataclasses.asdict(cfg.encoder)
    arch = (
        {"kind": "level0", "encoder": encoder}
        if cfg.level == 0
        else {"kind": "nested", "levels": [level0_config(config_path, cfg), *[encoder] * cfg.level]}
    )
    module = random_init(arch, seed)
    return ExportedEncoder(
        module,
        cfg.preprocess,
        arch,
        source=f"random:{config_path}",
        info={"level": cfg.level, "seed": seed, "random_init": True, "encoder": encoder},
    )


def level0_config(config_path: str | Path, cfg: RunConfig) -> dict:
    """Level 0 of a latent config's random baseline: the encoder of the `level0.yaml` beside it when
    that is a level-0 config of the same width and token layout, else the latent encoder section."""
    sibling = config_path_of(config_path).parent / "level0.yaml"
    if sibling.is_file():
        level0 = load_run_config(sibling)
        if level0.level == 0 and all(getattr(level0.encoder, k) == getattr(cfg.encoder, k) for k in SHARED_LAYOUT):
            return dataclasses.asdict(level0.encoder)
    return dataclasses.asdict(cfg.encoder)


def load_export(path: str | Path) -> ExportedEncoder:
    """An export folder or hf://ORG/NAME[@REVISION] as `load_encoder` loads it, its source the path as given."""
    exported = load_encoder(path)
    exported.source = str(path) if is_hub_ref(path) else str(Path(path))
    return exported


def resolve_encoder(path_or_random: str | Path, level: int | None = None) -> ExportedEncoder:
    """'random:<config.yaml>', a training run folder, an export folder or hf://ORG/NAME[@REVISION] ->
    ExportedEncoder; with `level`, its levels 0..level only (`ExportedEncoder.cut`: a level the encoder
    does not have is an EcgposError, one line)."""
    return _resolve(path_or_random).cut(level)


def _resolve(path_or_random: str | Path) -> ExportedEncoder:
    text = str(path_or_random)
    if text.startswith("random:"):
        return random_encoder(text.split(":", 1)[1])
    if is_hub_ref(text):
        return load_export(text)
    path = Path(text).expanduser()
    if not path.exists():
        raise EcgposError(
            f"encoder {path} does not exist (expected a run folder, an export folder or random:<config.yaml>)"
        )
    if is_export_dir(path):
        return load_export(path)
    if is_run_dir(path):
        return load_run_encoder(path)
    raise EcgposError(
        f"{path} is neither a training run folder (config.yaml + checkpoints/) nor an export folder (config.json)"
    )


def refuse_model_folder(path: str | Path, flag: str = "--out") -> None:
    """EcgposError when an output folder is, or lies inside, a training run, an exported encoder or a
    shard folder: results written there would mix with, and could overwrite, what the folder is read for
    (an export's test vectors, a run's checkpoints, a shard beside the shards)."""
    if path is None:
        return
    path = Path(path)
    kind = None if not is_export_dir(path) else "a classifier export" if _is_classifier(path) else "an exported encoder"
    kind = kind or ("a training run" if is_run_dir(path) else None)
    if kind:
        raise EcgposError(f"{flag} {path} is {kind} folder: give the results a folder of their own")
    inside = artifact_above(path)
    if inside is not None:
        raise EcgposError(f"{flag} {path} is inside {inside[1]} {inside[0]}: give the results a folder of their own")


def _is_classifier(folder: Path) -> bool:
    """Whether an export folder's config.json says it is a classifier export (False when unreadable)."""
    import json

    from ecgpos.export.format import CLASSIFIER_FORMAT, CONFIG_FILE

    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("format") == CLASSIFIER_FORMAT


def artifact_above(path: str | Path) -> tuple[Path, str] | None:
    """(folder, what) of the nearest export, run or shard folder that `path` is or lies inside; None if none."""
    from ecgpos.ecg.shards import SHARD_GLOB
    from ecgpos.export.format import WEIGHTS_FILE

    for folder in [Path(path).absolute(), *Path(path).absolute().parents]:
        if not folder.is_dir():
            continue
        if is_export_dir(folder) and (folder / WEIGHTS_FILE).is_file():
            return folder, "the classifier export" if _is_classifier(folder) else "the exported encoder"
        if is_run_dir(folder):
            return folder, "the training run"
        if (folder / "preprocess.json").is_file() or next(folder.glob(SHARD_GLOB), None) is not None:
            return folder, "the shard folder"
    return None
