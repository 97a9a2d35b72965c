"""The training model of each stage, built from a RunConfig (trainer, run folders, benchmarks).

Stage 0: MaskedECGAutoencoder(STMEMEncoder(cfg.encoder), cfg.decoder, ...).
Stage 1: LatentMaskedAutoencoder(frozen Stage-0 encoder, LatentEncoder(cfg.encoder), ...), where
cfg.encoder describes the latent encoder and must have the Stage-0 width and token layout.
"""

from __future__ import annotations

from torch import nn

from ecgpos.config import to_dict
from ecgpos.errors import ConfigError
from ecgpos.models.nested import check_stages_fit
from ecgpos.models.st_mem import STMEMEncoder
from ecgpos.objectives.stage0_mae import MaskedECGAutoencoder
from ecgpos.runs.run_config import RunConfig


def build_stage0_model(cfg: RunConfig) -> MaskedECGAutoencoder:
    """Fresh Stage-0 masked autoencoder (initialised from the current torch RNG)."""
    return MaskedECGAutoencoder(
        STMEMEncoder(cfg.encoder), cfg.decoder, mask_ratio=cfg.mask_ratio, norm_target=cfg.norm_target
    )


def check_stage0_fits(stage0: STMEMEncoder, cfg: RunConfig, what: str) -> None:
    """ConfigError (one line) unless the Stage-0 encoder's width and token layout match cfg.encoder."""
    check_stages_fit(stage0.cfg, cfg.encoder, what)


def build_stage1_model(cfg: RunConfig, stage0: STMEMEncoder) -> nn.Module:
    """Stage-1 latent masked autoencoder around a (frozen inside) Stage-0 encoder."""
    from ecgpos.models.latent_encoder import LatentEncoder
    from ecgpos.objectives.latent_mae import LatentMaskedAutoencoder

    check_stage0_fits(stage0, cfg, "the Stage-0 encoder")
    return LatentMaskedAutoencoder(
        stage0,
        LatentEncoder(cfg.encoder),
        cfg.decoder,
        mask_ratio=cfg.mask_ratio,
        norm_target=cfg.norm_target,
        push_pull=cfg.push_pull,
    )


def build_model(cfg: RunConfig, stage0: STMEMEncoder | None = None) -> nn.Module:
    if cfg.stage == 0:
        return build_stage0_model(cfg)
    if stage0 is None:
        raise ConfigError("Stage 1 needs a Stage-0 encoder (--stage0 RUN_OR_EXPORT_DIR)")
    return build_stage1_model(cfg, stage0)


def stage0_of(model: nn.Module) -> STMEMEncoder | None:
    """The frozen Stage-0 encoder inside a Stage-1 model (None for Stage 0)."""
    return getattr(model, "stage0", None)


def trainable_encoder(model: nn.Module) -> nn.Module:
    """What a run produces for downstream use: the Stage-0 encoder, or the nested encoder."""
    if hasattr(model, "nested_encoder"):
        return model.nested_encoder()
    return model.encoder


def stage0_config_dict(stage0: STMEMEncoder) -> dict:
    return to_dict(stage0.cfg)
