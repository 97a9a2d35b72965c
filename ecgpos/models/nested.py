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

from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.st_mem import STMEMEncoder


class NestedEncoder(nn.Module):
    """Composition stage1(stage0(x)); `.width` is the Stage-1 width (= Stage-0 width)."""

    def __init__(self, stage0: STMEMEncoder, stage1: LatentEncoder) -> None:
        super().__init__()
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
