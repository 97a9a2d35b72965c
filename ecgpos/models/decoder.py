"""The per-lead transformer decoder shared by every level.

Each lead's N + 2 tokens (SEP, patches, SEP) are decoded on their own, with the blocks' weights
shared across leads; level 0 decodes to signal patches (P values), level 1 to latent tokens (W).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from timm.models.vision_transformer import Block
from torch import nn

from ecgpos.models.masking import unshuffle_with_mask_tokens
from ecgpos.models.st_mem import check_transformer_config, init_weights, sincos_1d, with_sep


@dataclass
class DecoderConfig:
    """Per-lead decoder of every level: 4 blocks in the paper; 256 wide with 4 heads as in ST-MEM."""

    width: int = 256
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        check_transformer_config(self, "decoder")


class PerLeadDecoder(nn.Module):
    """Linear(in -> Dw), mask tokens, position + lead embeddings, blocks per lead, LayerNorm,
    Linear(Dw -> out_dim). Leads are folded into the batch ((B*L, N+2, Dw)) so the blocks share
    their weights across leads and attention stays inside a lead."""

    def __init__(self, in_width: int, cfg: DecoderConfig, num_leads: int, num_patches: int, out_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_leads = num_leads
        self.num_patches = num_patches
        self.embed = nn.Linear(in_width, cfg.width)
        self.mask_token = nn.Parameter(torch.zeros(cfg.width))
        self.register_buffer("pos_embed", sincos_1d(cfg.width, num_patches), persistent=False)
        self.lead_embed = nn.Parameter(torch.zeros(num_leads, cfg.width))
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=True) for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.width, eps=1e-6)
        self.head = nn.Linear(cfg.width, out_dim)
        self.apply(init_weights)
        nn.init.normal_(self.mask_token, std=0.02)
        nn.init.normal_(self.lead_embed, std=0.02)

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor | None = None) -> torch.Tensor:
        """latent (B, L, K+2, W) [SEP, kept tokens (shuffled), SEP] and ids_restore (B, L, N)
        -> pred (B, L, N, out_dim) in time order, SEP outputs dropped.
        With ids_restore None the latent must hold all N patch tokens in time order (K = N)."""
        z = self.embed(latent)
        seps = torch.cat([z[:, :, :1], z[:, :, -1:]], dim=2)
        patches = z[:, :, 1:-1]
        if ids_restore is not None:
            patches = unshuffle_with_mask_tokens(patches, self.mask_token, ids_restore)
        tokens = with_sep(patches + self.pos_embed[None, None], seps) + self.lead_embed[None, :, None]
        b, l, s, w = tokens.shape
        out = tokens.reshape(b * l, s, w)
        for block in self.blocks:
            out = block(out)
        out = self.head(self.norm(out))
        return out.reshape(b, l, s, -1)[:, :, 1:-1]
