"""Stage 0 objective: ST-MEM masked autoencoder around an `STMEMEncoder`.

Three stages, as in MAE:
    forward_encoder(x)               -> latent (B, L, K+2, W), mask (B, L, N), ids_restore (B, L, N)
    forward_decoder(latent, ids)     -> pred (B, L, N, P)
    forward_loss(x, pred, mask)      -> loss (scalar), target (B, L, N, P)
The decoder (`PerLeadDecoder`) runs each lead's N + 2 tokens on their own, with weights shared
across leads, and is reused by Stage 1 with the latent width as its output size.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from timm.models.vision_transformer import Block

from .masking import check_mask_ratio, unshuffle_with_mask_tokens
from .st_mem import STMEMEncoder, check_transformer_config, init_weights, patchify, sincos_1d, with_sep

TARGET_EPS = 1e-6


@dataclass
class DecoderConfig:
    """Per-lead decoder: 256 wide, 4 blocks, 4 heads in the paper (both stages)."""

    width: int = 256
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0

    def __post_init__(self) -> None:
        check_transformer_config(self, "decoder")


def normalise_tokens(t: torch.Tensor, eps: float = TARGET_EPS) -> torch.Tensor:
    """Per-patch (per-token) normalisation over the last dim: (t - mean) / sqrt(var + eps)."""
    mean = t.mean(dim=-1, keepdim=True)
    var = t.var(dim=-1, keepdim=True, unbiased=False)
    return (t - mean) / torch.sqrt(var + eps)


def masked_mse(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over masked positions only.

    pred, target (B, L, N, D); mask (B, L, N) bool True = masked -> scalar
    (mean over D per patch, then mean over masked patches).
    """
    per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)
    weights = mask.to(per_patch.dtype)
    return (per_patch * weights).sum() / weights.sum().clamp_min(1.0)


class PerLeadDecoder(nn.Module):
    """Linear(in -> Dw), mask tokens, position + lead embeddings, blocks per lead, LayerNorm,
    Linear(Dw -> out_dim). Leads are folded into the batch ((B*L, N+2, Dw)) so the blocks share
    their weights across leads and attention stays inside a lead."""

    def __init__(self, in_width: int, cfg: DecoderConfig, num_leads: int, num_patches: int,
                 out_dim: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_leads = num_leads
        self.num_patches = num_patches
        self.embed = nn.Linear(in_width, cfg.width)
        self.mask_token = nn.Parameter(torch.zeros(cfg.width))
        self.register_buffer("pos_embed", sincos_1d(cfg.width, num_patches), persistent=False)
        self.lead_embed = nn.Parameter(torch.zeros(num_leads, cfg.width))
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=True)
            for _ in range(cfg.depth))
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


class MaskedECGAutoencoder(nn.Module):
    """ST-MEM masked autoencoder: x (B, 12, 2250) -> dict(loss, pred, target, mask).

    pred/target (B, 12, 30, 75) are in normalised-patch units when norm_target (the default);
    `to_signal_units(x, pred)` maps pred back to the input's units for figures.
    """

    def __init__(self, encoder: STMEMEncoder, decoder: DecoderConfig, mask_ratio: float = 0.75,
                 norm_target: bool = True) -> None:
        super().__init__()
        check_mask_ratio(mask_ratio, encoder.num_patches)
        self.encoder = encoder
        self.decoder_cfg = decoder
        self.mask_ratio = float(mask_ratio)
        self.norm_target = bool(norm_target)
        self.decoder = PerLeadDecoder(encoder.width, decoder, encoder.num_leads, encoder.num_patches,
                                      encoder.patch_size)

    def forward_encoder(self, x: torch.Tensor, generator: torch.Generator | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, T) -> latent (B, L, K+2, W), mask (B, L, N) bool, ids_restore (B, L, N)."""
        return self.encoder.forward_masked(x, self.mask_ratio, generator)

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """latent (B, L, K+2, W), ids_restore (B, L, N) -> pred (B, L, N, P)."""
        return self.decoder(latent, ids_restore)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction target (B, L, N, P): patches, normalised per patch if norm_target."""
        patches = patchify(x, self.encoder.patch_size)
        return normalise_tokens(patches) if self.norm_target else patches

    def forward_loss(self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """MSE over masked patches only -> (loss scalar float32, target (B, L, N, P))."""
        target = self.target(x)
        return masked_mse(pred, target, mask), target

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """x (B, L, T) -> {"loss": (), "pred": (B,L,N,P), "target": (B,L,N,P), "mask": (B,L,N) bool}."""
        latent, mask, ids_restore = self.forward_encoder(x, generator)
        pred = self.forward_decoder(latent, ids_restore)
        loss, target = self.forward_loss(x, pred, mask)
        return {"loss": loss, "pred": pred, "target": target, "mask": mask}

    @torch.no_grad()
    def to_signal_units(self, x: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """pred (B, L, N, P) -> (B, L, N, P) in x's units, undoing per-patch normalisation with
        each input patch's own mean and std (identity when norm_target is False)."""
        if not self.norm_target:
            return pred
        patches = patchify(x, self.encoder.patch_size).float()
        mean = patches.mean(dim=-1, keepdim=True)
        std = torch.sqrt(patches.var(dim=-1, keepdim=True, unbiased=False) + TARGET_EPS)
        return pred.float() * std + mean
