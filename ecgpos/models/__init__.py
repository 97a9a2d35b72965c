"""ecgpos models.

Stage 0: STMEMEncoder (ST-MEM-style encoder) trained by MaskedECGAutoencoder.
Stage 1: LatentEncoder trained by LatentMaskedAutoencoder on frozen Stage-0 tokens (optionally with
Dynamic Push and Pull); NestedEncoder = Stage 0 -> Stage 1 for probes and export.
factory: arch dicts <-> modules, strict weight loading.
"""
from .factory import build_encoder, build_nested, encoder_arch, encoder_config, encoder_from_state, module_from_arch
from .latent_mae import LatentEncoder, LatentMaskedAutoencoder
from .masked_autoencoder import DecoderConfig, MaskedECGAutoencoder, PerLeadDecoder, masked_mse, normalise_tokens
from .masking import check_mask_ratio, num_kept, random_masking
from .nested import NestedEncoder
from .push_pull import PushPullConfig, perturb, push_pull_loss
from .st_mem import EncoderConfig, STMEMEncoder, TokenEncoder, param_count, patchify, unpatchify

__all__ = [
    "DecoderConfig", "EncoderConfig", "LatentEncoder", "LatentMaskedAutoencoder", "MaskedECGAutoencoder",
    "NestedEncoder", "PerLeadDecoder", "PushPullConfig", "STMEMEncoder", "TokenEncoder",
    "build_encoder", "build_nested", "check_mask_ratio", "encoder_arch", "encoder_config",
    "encoder_from_state", "masked_mse", "module_from_arch", "normalise_tokens", "num_kept",
    "param_count", "patchify", "perturb", "push_pull_loss", "random_masking", "unpatchify",
]
