"""The training model of each level, built from a RunConfig (trainer, run folders, benchmarks).

Level 0: MaskedECGAutoencoder(STMEMEncoder(cfg.encoder), cfg.decoder, ...).
Level N >= 1: LatentMaskedAutoencoder(frozen base = levels 0..N-1, LatentEncoder(cfg.encoder), ...),
where cfg.encoder describes level N's latent encoder and must have the base's width and token layout.
"""

from __future__ import annotations

from torch import nn

from ecgpos.config import to_dict
from ecgpos.errors import ConfigError
from ecgpos.models.factory import depth_of
from ecgpos.models.nested import check_levels_fit
from ecgpos.models.st_mem import STMEMEncoder
from ecgpos.objectives.level import LevelObjective
from ecgpos.objectives.level0_mae import MaskedECGAutoencoder
from ecgpos.runs.run_config import RunConfig


def build_level0_model(cfg: RunConfig) -> MaskedECGAutoencoder:
    """Fresh level-0 masked autoencoder (initialised from the current torch RNG)."""
    return MaskedECGAutoencoder(
        STMEMEncoder(cfg.encoder),
        cfg.decoder,
        mask_ratio=cfg.mask_ratio,
        norm_target=cfg.norm_target,
        push_pull=cfg.push_pull,
    )


def check_base_fits(base: nn.Module, cfg: RunConfig, what: str) -> None:
    """ConfigError (one line) unless the base's depth is cfg.level and its width and token layout
    match cfg.encoder."""
    depth = depth_of(base)
    if depth != cfg.level:
        raise ConfigError(
            f"{what} has {depth} level{'s' if depth > 1 else ''} (0..{depth - 1}) but level {cfg.level} "
            f"trains on levels 0..{cfg.level - 1}: pass a base of {cfg.level} level{'s' if cfg.level > 1 else ''}"
        )
    check_levels_fit(base.cfg, cfg.encoder, what)


def build_latent_model(cfg: RunConfig, base: nn.Module) -> LevelObjective:
    """Level-N latent masked autoencoder around a (frozen inside) base of levels 0..N-1."""
    from ecgpos.models.latent_encoder import LatentEncoder
    from ecgpos.objectives.latent_mae import LatentMaskedAutoencoder

    check_base_fits(base, cfg, "the base encoder")
    return LatentMaskedAutoencoder(
        base,
        LatentEncoder(cfg.encoder),
        cfg.decoder,
        mask_ratio=cfg.mask_ratio,
        norm_target=cfg.norm_target,
        push_pull=cfg.push_pull,
    )


def build_model(cfg: RunConfig, base: nn.Module | None = None) -> LevelObjective:
    """The training model of level cfg.level; levels >= 1 need their frozen `base`."""
    if cfg.level == 0:
        return build_level0_model(cfg)
    if base is None:
        raise ConfigError(f"level {cfg.level} needs its base, levels 0..{cfg.level - 1} (--base RUN_OR_EXPORT_DIR)")
    return build_latent_model(cfg, base)


def base_of(model: LevelObjective) -> nn.Module | None:
    """The frozen base inside a latent level's model (None at level 0)."""
    return model.base


def trainable_encoder(model: LevelObjective) -> nn.Module:
    """What a run produces for downstream use: the level-0 encoder, or the nested encoder."""
    return model.nested_encoder()


def encoder_config_dict(encoder: nn.Module) -> dict:
    """The EncoderConfig of one level as a plain dict."""
    return to_dict(encoder.cfg)
