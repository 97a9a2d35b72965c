"""Frozen encoders for downstream use, from a run folder, an export folder or a random init.

`resolve_encoder(x)` is the one entry point probes use: a training run folder (its newest complete
checkpoint), an export folder (ecgpos.export.load), or 'random:<config.yaml>' (the random-init
baseline). Anything unloadable raises EcgposError with one line.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .checkpoint import WEIGHTS_FILE, newest_checkpoint, read_trainer_state
from .config import load_config, to_dict
from .errors import EcgposError
from .models.st_mem import EncoderConfig, STMEMEncoder
from .run_config import RunConfig
from .spec import PreprocessSpec

RUN_INFO = "run_info.json"
RUN_CONFIG = "config.yaml"


@dataclass
class LoadedEncoder:
    """An eval-mode, frozen encoder (forward_features / forward_tokens / .width) and its provenance."""

    module: nn.Module
    spec: PreprocessSpec
    arch: dict
    source: str
    info: dict = field(default_factory=dict)


def weights_hash(module: nn.Module) -> str:
    """sha256 over the state dict's tensors (name, dtype, shape, bytes; keys sorted): the same value
    an export records as `weights_sha256`, so a run's encoder and its export can be matched."""
    from .export.load import state_sha256

    return state_sha256(module.state_dict())


def _freeze(module: nn.Module) -> nn.Module:
    module.requires_grad_(False)
    return module.eval()


def _arch(module: nn.Module) -> dict:
    from .models.factory import encoder_arch

    return encoder_arch(module)


def read_run_info(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / RUN_INFO
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise EcgposError(f"{path} is not valid JSON: {err}") from None


def is_run_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / RUN_CONFIG).is_file() and ((path / RUN_INFO).is_file() or (path / "checkpoints").is_dir())


def load_run_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The training model's tensors of a checkpoint (safetensors: no unpickling)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(checkpoint / WEIGHTS_FILE), device="cpu")
    except (SafetensorError, OSError, ValueError) as err:
        raise EcgposError(f"{checkpoint / WEIGHTS_FILE} is not readable: {str(err).splitlines()[0]}") from None


def load_run_model(run_dir: str | Path) -> tuple[nn.Module, RunConfig, Path, dict]:
    """(training model with the newest complete checkpoint's weights, config, checkpoint, run info)."""
    from .pretrain_models import build_model

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EcgposError(f"run folder {run_dir} does not exist")
    if not (run_dir / RUN_CONFIG).is_file():
        raise EcgposError(f"{run_dir} is not a training run folder (no {RUN_CONFIG})")
    checkpoint = newest_checkpoint(run_dir)
    if checkpoint is None:
        raise EcgposError(f"{run_dir} has no complete checkpoint (checkpoints/step-*/ with {WEIGHTS_FILE}): "
                          "the run is incomplete or still before its first checkpoint")
    cfg = load_config(RunConfig, run_dir / RUN_CONFIG)
    info = read_run_info(run_dir)
    stage0 = None
    if cfg.stage == 1:
        if "stage0_encoder" not in info:
            raise EcgposError(f"{run_dir / RUN_INFO} lacks stage0_encoder: cannot rebuild the Stage-1 model")
        stage0 = STMEMEncoder(EncoderConfig(**info["stage0_encoder"]))
    model = build_model(cfg, stage0)
    state = load_run_weights(checkpoint)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        text = " ".join(str(err).split())
        raise EcgposError(f"{checkpoint / WEIGHTS_FILE} does not fit the run's config: {text[:300]}") from None
    return model, cfg, checkpoint, info


def load_run_encoder(run_dir: str | Path) -> LoadedEncoder:
    """Encoder of a run's newest complete checkpoint: STMEMEncoder (stage 0) or NestedEncoder (stage 1)."""
    from .pretrain_models import trainable_encoder

    model, cfg, checkpoint, info = load_run_model(run_dir)
    module = _freeze(trainable_encoder(model))
    step = read_trainer_state(checkpoint)["step"]
    details = {"stage": cfg.stage, "step": step, "checkpoint": str(checkpoint), "run_dir": str(Path(run_dir)),
               "steps": cfg.optim.steps, "finished": bool(info.get("finished", False)) and step >= cfg.optim.steps}
    if cfg.stage == 1:
        details["stage0"] = info.get("stage0")
    return LoadedEncoder(module, cfg.preprocess, _arch(module), str(Path(run_dir)), details)


def random_encoder(config_path: str | Path, seed: int = 0) -> LoadedEncoder:
    """Randomly initialised encoder of a run config (the random-init baseline).

    Stage-0 configs give an STMEMEncoder; Stage-1 configs a NestedEncoder whose Stage-0 part uses
    the same encoder section (a Stage-1 config must have the Stage-0 width and layout anyway).
    The global RNG is left as it was.
    """
    from .models.latent_mae import LatentEncoder
    from .models.nested import NestedEncoder

    cfg = load_config(RunConfig, config_path)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        stage0 = STMEMEncoder(cfg.encoder)
        module = stage0 if cfg.stage == 0 else NestedEncoder(stage0, LatentEncoder(cfg.encoder))
    module = _freeze(module)
    return LoadedEncoder(module, cfg.preprocess, _arch(module), f"random:{config_path}",
                         {"stage": cfg.stage, "seed": seed, "random_init": True, "encoder": to_dict(cfg.encoder)})


def load_export(path: str | Path) -> LoadedEncoder:
    from .export.load import load_encoder

    exported = load_encoder(path)
    return LoadedEncoder(_freeze(exported), exported.spec, dict(exported.arch), str(Path(path)), dict(exported.info))


def resolve_encoder(path_or_random: str | Path) -> LoadedEncoder:
    """'random:<config.yaml>', a training run folder, or an export folder -> LoadedEncoder."""
    text = str(path_or_random)
    if text.startswith("random:"):
        return random_encoder(text.split(":", 1)[1])
    path = Path(text)
    if not path.exists():
        raise EcgposError(f"encoder {path} does not exist (expected a run folder, an export folder or "
                          "random:<config.yaml>)")
    if (path / "config.json").is_file():
        return load_export(path)
    if is_run_dir(path):
        return load_run_encoder(path)
    raise EcgposError(f"{path} is neither a training run folder (config.yaml + checkpoints/) nor an export "
                      "folder (config.json)")
