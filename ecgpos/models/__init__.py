"""nn.Modules only: the encoders of both stages, the per-lead decoder, masking, and the factory.

STMEMEncoder (Stage 0) reads signal patches; LatentEncoder (Stage 1) reads frozen Stage-0 tokens;
NestedEncoder = Stage 0 -> Stage 1 for probes and export. What they are trained with lives in
ecgpos.objectives. factory: arch dicts <-> modules, random init, strict weight loading.
"""

from ecgpos.models.decoder import DecoderConfig, PerLeadDecoder
from ecgpos.models.factory import (
    build_encoder,
    build_nested,
    encoder_arch,
    encoder_config,
    encoder_from_state,
    module_from_arch,
)
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.masking import check_mask_ratio, num_kept, random_masking
from ecgpos.models.nested import NestedEncoder
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
    "encoder_arch",
    "encoder_config",
    "encoder_from_state",
    "module_from_arch",
    "num_kept",
    "param_count",
    "patchify",
    "random_masking",
    "unpatchify",
]
