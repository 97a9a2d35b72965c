"""Level-1 encoder: the same transformer as level 0's, over frozen level-0 tokens instead of signal patches."""

from __future__ import annotations

import torch
from torch import nn

from ecgpos.errors import EcgposError
from ecgpos.models.st_mem import EncoderConfig, TokenEncoder


class LatentEncoder(TokenEncoder):
    """Level-1 encoder over level-0 tokens (B, L * (N + 2), W) -> same interface as STMEMEncoder:
    forward_tokens(tokens) -> (B, L * (N + 2), W), forward_features(tokens) -> (B, W),
    forward_masked(tokens, mask_ratio, generator) -> (latent (B, L, K+2, W), mask, ids_restore).

    Token embedding (shared by all tokens) LayerNorm(W) -> Linear(W, W) -> LayerNorm(W), the
    counterpart of level 0's patch embedding; then the same sin-cos position embedding on patch
    tokens and a learnable lead embedding on every token. cfg.seq_len / cfg.patch_size only fix N.
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__(cfg)
        self.token_embed = nn.Sequential(
            nn.LayerNorm(cfg.width, eps=1e-6), nn.Linear(cfg.width, cfg.width), nn.LayerNorm(cfg.width, eps=1e-6)
        )
        self._init_parameters()

    def check_input(self, tokens: torch.Tensor) -> None:
        """Raise EcgposError unless tokens are (B, L * (N + 2), W); only static dims are checked."""
        expected = self.num_leads * self.tokens_per_lead
        if tokens.ndim != 3 or tokens.shape[1] != expected or tokens.shape[2] != self.width:
            raise EcgposError(f"expected level-0 tokens (B, {expected}, {self.width}), got {tuple(tokens.shape)}")

    def embed(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens (B, L*(N+2), W) -> patch tokens (B, L, N, W), SEP tokens (B, L, 2, W)."""
        self.check_input(tokens)
        e = self.token_embed(tokens.reshape(-1, self.num_leads, self.tokens_per_lead, self.width))
        lead = self.lead_embed[None, :, None]
        patches = e[:, :, 1:-1] + self.pos_embed[None, None] + lead
        seps = torch.cat([e[:, :, :1], e[:, :, -1:]], dim=2) + lead
        return patches, seps
