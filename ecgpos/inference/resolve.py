"""Frozen encoders for downstream use, from a run folder, an export folder or a random init.

`resolve_encoder(x)` is the one entry point probes use: a training run folder (its newest complete
checkpoint), an export folder (ecgpos.export.load) or `hf://ORG/NAME[@REVISION]` (ecgpos.export.hub),
or 'random:<config.yaml>' (the random-init baseline). Anything unloadable raises EcgposError with one line.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from torch import nn

from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import EcgposError
from ecgpos.export.format import is_export_dir
from ecgpos.export.hub import is_hub_ref
from ecgpos.models.factory import random_init
from ecgpos.runs.run_config import load_run_config
from ecgpos.runs.run_folder import is_run_dir, load_run_model, read_trainer_state


@dataclass
class LoadedEncoder:
    """An eval-mode, frozen encoder (forward_features / forward_tokens / .width) and its provenance."""

    module: nn.Module
    spec: PreprocessSpec
    arch: dict
    source: str
    info: dict = field(default_factory=dict)


def _freeze(module: nn.Module) -> nn.Module:
    module.requires_grad_(False)
    return module.eval()


def _arch(module: nn.Module) -> dict:
    from ecgpos.models.factory import encoder_arch

    return encoder_arch(module)


def load_run_encoder(run_dir: str | Path) -> LoadedEncoder:
    """Encoder of a run's newest complete checkpoint: STMEMEncoder (stage 0) or NestedEncoder (stage 1)."""
    from ecgpos.runs.stages import trainable_encoder

    model, cfg, checkpoint, info = load_run_model(run_dir)
    module = _freeze(trainable_encoder(model))
    step = read_trainer_state(checkpoint)["step"]
    details = {
        "stage": cfg.stage,
        "step": step,
        "checkpoint": str(checkpoint),
        "run_dir": str(Path(run_dir)),
        "steps": cfg.optim.steps,
        "finished": bool(info.get("finished", False)) and step >= cfg.optim.steps,
    }
    if cfg.stage == 1:
        details["stage0"] = info.get("stage0")
    return LoadedEncoder(module, cfg.preprocess, _arch(module), str(Path(run_dir)), details)


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


def random_encoder(config_path: str | Path, seed: int = 0) -> LoadedEncoder:
    """Randomly initialised encoder of a run config (the random-init baseline).

    Stage-0 configs give an STMEMEncoder; Stage-1 configs a NestedEncoder whose Stage-0 part uses
    the same encoder section (a Stage-1 config must have the Stage-0 width and layout anyway).
    """
    cfg = load_run_config(config_path)
    encoder = dataclasses.asdict(cfg.encoder)
    arch = (
        {"kind": "stage0", "encoder": encoder}
        if cfg.stage == 0
        else {"kind": "nested", "stage0": encoder, "stage1": encoder}
    )
    module = random_init(arch, seed)
    return LoadedEncoder(
        module,
        cfg.preprocess,
        arch,
        f"random:{config_path}",
        {"stage": cfg.stage, "seed": seed, "random_init": True, "encoder": encoder},
    )


def load_export(path: str | Path) -> LoadedEncoder:
    from ecgpos.export.load import load_encoder

    exported = load_encoder(path)
    source = str(path) if is_hub_ref(path) else str(Path(path))
    return LoadedEncoder(_freeze(exported), exported.spec, dict(exported.arch), source, dict(exported.info))


def resolve_encoder(path_or_random: str | Path) -> LoadedEncoder:
    """'random:<config.yaml>', a training run folder, an export folder or hf://ORG/NAME[@REVISION] -> LoadedEncoder."""
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
    """EcgposError when an output folder is a training run or an exported encoder: results written
    there would mix with, and could overwrite, what the folder is read for."""
    if path is None:
        return
    kind = "an exported encoder" if is_export_dir(path) else "a training run" if is_run_dir(path) else None
    if kind:
        raise EcgposError(f"{flag} {path} is {kind} folder: give the results a folder of their own")
