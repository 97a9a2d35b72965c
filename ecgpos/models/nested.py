"""Nested encoder for probes and export: Stage-0 encoder -> Stage-1 encoder, no masking.

Same interface as STMEMEncoder, so probes and export treat both alike:
    forward_tokens(x (B, 12, 2250))   -> (B, 12 * 32, W)   Stage-1 tokens after its final norm
    forward_features(x (B, 12, 2250)) -> (B, W)            Stage-1 block outputs averaged over the
                                                           patch tokens (SEP excluded), then its norm
State-dict keys: "stage0.*" (STMEMEncoder) and "stage1.*" (LatentEncoder).
"""

from __future__ import annotations

import torch
from torch import nn

from ecgpos.errors import ConfigError
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.st_mem import EncoderConfig, STMEMEncoder

# What Stage 1 must share with Stage 0: it reads Stage-0 tokens, so the same width and token layout.
SHARED_LAYOUT = ("width", "num_leads", "seq_len", "patch_size")


def check_stages_fit(stage0: EncoderConfig, stage1: EncoderConfig, what: str = "the Stage-0 encoder") -> None:
    """ConfigError (one line) unless a Stage-1 encoder config can read `stage0`'s tokens."""
    for name in SHARED_LAYOUT:
        if getattr(stage0, name) != getattr(stage1, name):
            raise ConfigError(
                f"{what} has {name} {getattr(stage0, name)} but the Stage-1 encoder's {name} is "
                f"{getattr(stage1, name)} (Stage 1 runs at the Stage-0 width and token layout)"
            )


class NestedEncoder(nn.Module):
    """Composition stage1(stage0(x)); `.width` is the Stage-1 width (= Stage-0 width)."""

    def __init__(self, stage0: STMEMEncoder, stage1: LatentEncoder) -> None:
        super().__init__()
        check_stages_fit(stage0.cfg, stage1.cfg)
        self.stage0 = stage0
        self.stage1 = stage1
        self.width = stage1.width
        self.num_leads = stage1.num_leads
        self.num_patches = stage1.num_patches
        self.tokens_per_lead = stage1.tokens_per_lead

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, T) -> (B, L * (N + 2), W)."""
        return self.stage1.forward_tokens(self.stage0.forward_tokens(x))

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, T) -> (B, W), pooled as the Stage-0 encoder pools."""
        return self.stage1.forward_features(self.stage0.forward_tokens(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Same as `forward_features` (B, W)."""
        return self.forward_features(x)
