"""nn.Modules only: the encoders of every level, the per-lead decoder, masking, and the factory.

STMEMEncoder (level 0) reads signal patches; LatentEncoder (any level >= 1) reads the frozen tokens
of the level below; NestedEncoder = levels 0 -> 1 -> ... for probes and export. What they are trained with lives in
ecgpos.objectives. factory: arch dicts <-> modules, random init, strict weight loading.
"""

from ecgpos.models.decoder import DecoderConfig, PerLeadDecoder
from ecgpos.models.factory import (
    build_encoder,
    build_nested,
    cut_encoder,
    encoder_arch,
    encoder_config,
    encoder_from_state,
    levels_of,
    module_from_arch,
)
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.masking import check_mask_ratio, num_kept, random_masking
from ecgpos.models.nested import NestedEncoder, level_name, level_names
from ecgpos.models.st_mem import EncoderConfig, STMEMEncoder, TokenEncoder, param_count, patchify, unpatchify

__all__ = [
    "DecoderConfig",
    "EncoderConfig",
    "LatentEncoder",
    "NestedEncoder",
    "PerLeadDecoder",
    "STMEMEncoder",
    "TokenEncoder",
    "build_encoder",
    "build_nested",
    "check_mask_ratio",
    "cut_encoder",
    "encoder_arch",
    "encoder_config",
    "encoder_from_state",
    "level_name",
    "level_names",
    "levels_of",
    "module_from_arch",
    "num_kept",
    "param_count",
    "patchify",
    "random_masking",
    "unpatchify",
]
