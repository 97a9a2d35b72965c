"""Level 0 encoder: an ST-MEM-style transformer over 12-lead ECG patches (Na et al., ICLR 2024).

Token layout (the interface level 1, probes and export build on):
    input x (B, L=12, T=2250) -> patches (B, L, N=30, P=75)
    per lead: [SEP, patch_1 .. patch_N, SEP]      -> N + 2 = 32 tokens per lead
    sequence: lead-major, lead 0's 32 tokens, then lead 1's ... -> (B, L * 32, width)
Every patch token = shared patch embedding (LayerNorm(P) -> Linear(P, W) -> LayerNorm(W))
    + fixed 1-D sin-cos position of the patch in time (shared by all leads)
    + a learnable embedding of its lead.
SEP tokens = one learnable SEP vector + the lead embedding (zero position embedding).
All L * (N + 2) tokens attend to each other jointly (timm Blocks, which use
F.scaled_dot_product_attention).

`TokenEncoder` holds everything except the input embedding, so the level-1 `LatentEncoder`
(latent_encoder.py) is a network "of the same form" over level-0 tokens instead of raw patches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from timm.models.vision_transformer import Block
from torch import nn

from ecgpos.errors import ConfigError, EcgposError
from ecgpos.models.masking import check_mask_ratio, gather_tokens, random_masking


def check_transformer_config(cfg: Any, section: str, extra_positive: tuple[str, ...] = ()) -> None:
    """Shared checks of an encoder/decoder config (width, depth, heads, mlp_ratio): one-line ConfigError."""
    for name in (*extra_positive, "width", "depth", "heads"):
        if int(getattr(cfg, name)) < 1:
            raise ConfigError(f"{section}.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.width % cfg.heads:
        raise ConfigError(f"{section}.width {cfg.width} is not divisible by {section}.heads {cfg.heads}")
    if cfg.width % 2:
        raise ConfigError(f"{section}.width must be even (sin-cos position embedding), got {cfg.width}")
    if cfg.mlp_ratio <= 0:
        raise ConfigError(f"{section}.mlp_ratio must be > 0, got {cfg.mlp_ratio}")


@dataclass
class EncoderConfig:
    """Encoder hyper-parameters; level 0, the paper's Stage 0: depth 6 (ST-MEM: 12); width 768, 12 heads,
    patch 75 and MLP ratio 4 are ST-MEM's base model, which the paper follows without restating them."""

    num_leads: int = 12
    seq_len: int = 2250
    patch_size: int = 75
    width: int = 768
    depth: int = 6
    heads: int = 12
    mlp_ratio: float = 4.0
    qkv_bias: bool = True

    def __post_init__(self) -> None:
        check_transformer_config(self, "encoder", ("num_leads", "seq_len", "patch_size"))
        if self.seq_len % self.patch_size:
            raise ConfigError(
                f"encoder.seq_len {self.seq_len} is not a multiple of encoder.patch_size {self.patch_size}"
            )

    @property
    def num_patches(self) -> int:
        """Patches per lead (30 for 2250 / 75)."""
        return self.seq_len // self.patch_size


def sincos_1d(width: int, length: int) -> torch.Tensor:
    """Fixed sin-cos embedding (length, width) of positions 0..length-1 (first half sin, then cos)."""
    half = width // 2
    omega = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float64) / half))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * omega[None, :]
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1).float()


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, L, T) -> (B, L, T // patch_size, patch_size); T must be a multiple of patch_size."""
    return x.reshape(x.shape[0], x.shape[1], x.shape[2] // patch_size, patch_size)


def unpatchify(patches: torch.Tensor) -> torch.Tensor:
    """(B, L, N, P) -> (B, L, N * P); exact inverse of `patchify`."""
    return patches.reshape(patches.shape[0], patches.shape[1], patches.shape[2] * patches.shape[3])


def with_sep(patches: torch.Tensor, seps: torch.Tensor) -> torch.Tensor:
    """Wrap each lead in its SEP tokens: patches (B, L, n, W), seps (B, L, 2, W) -> (B, L, n + 2, W)."""
    return torch.cat([seps[:, :, :1], patches, seps[:, :, 1:]], dim=2)


def init_weights(module: nn.Module) -> None:
    """MAE-style init: xavier-uniform Linear weights with zero bias, unit LayerNorm."""
    if isinstance(module, nn.Linear):
        nn.init.xavier_uniform_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class TokenEncoder(nn.Module):
    """Position/lead embeddings, transformer blocks and final norm; subclasses define `embed`."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.width = cfg.width
        self.num_leads = cfg.num_leads
        self.num_patches = cfg.num_patches
        self.tokens_per_lead = cfg.num_patches + 2
        # Fixed, derived from the config: not persistent, so state dicts hold only learned weights.
        self.register_buffer("pos_embed", sincos_1d(cfg.width, cfg.num_patches), persistent=False)
        self.lead_embed = nn.Parameter(torch.zeros(cfg.num_leads, cfg.width))
        self.blocks = nn.ModuleList(
            Block(cfg.width, cfg.heads, mlp_ratio=cfg.mlp_ratio, qkv_bias=cfg.qkv_bias) for _ in range(cfg.depth)
        )
        self.norm = nn.LayerNorm(cfg.width, eps=1e-6)

    def _init_parameters(self) -> None:
        self.apply(init_weights)
        nn.init.normal_(self.lead_embed, std=0.02)

    # -- subclass hook ---------------------------------------------------------------------------
    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Input -> (patch tokens (B, L, N, W) with position + lead embedding,
        SEP tokens (B, L, 2, W) with lead embedding)."""
        raise NotImplementedError

    # -- shared forward paths --------------------------------------------------------------------
    def _run_blocks(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, S, W) -> (B, S, W) through all blocks; the final norm is applied by the caller."""
        for block in self.blocks:
            tokens = block(tokens)
        return tokens

    def _encode_unmasked(self, x: torch.Tensor) -> torch.Tensor:
        """Input -> (B, L, N + 2, W) block outputs before the final norm."""
        patches, seps = self.embed(x)
        tokens = with_sep(patches, seps)
        out = self._run_blocks(tokens.flatten(1, 2))
        return out.reshape(-1, self.num_leads, self.tokens_per_lead, self.width)

    def forward_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Unmasked tokens after the final norm: (B, L * (N + 2), W), lead-major, SEP included."""
        return self.norm(self._encode_unmasked(x)).flatten(1, 2)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Pooled features (B, W): block outputs averaged over the L * N patch tokens (SEP tokens
        excluded), then the final norm. Norm after the mean (rather than mean of normed tokens)
        gives every feature vector the same LayerNorm scale, which suits linear probes."""
        tokens = self._encode_unmasked(x)[:, :, 1:-1]
        return self.norm(tokens.mean(dim=(1, 2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Same as `forward_features` (B, W), so a bare module call exports the probe features."""
        return self.forward_features(x)

    def embed_masked(
        self,
        x: torch.Tensor,
        mask_ratio: float,
        generator: torch.Generator | None = None,
        masking: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Embedded visible tokens before the blocks.

        Returns tokens (B, L, K + 2, W) = [SEP, K kept patches, SEP] per lead, mask (B, L, N) bool
        (True = masked), ids_restore (B, L, N). SEPs are outside the mask, so they are always kept.
        `masking` (ids_keep, mask, ids_restore) of batch size B uses a given mask instead of drawing one.
        """
        patches, seps = self.embed(x)
        b = patches.shape[0]
        if masking is not None:
            ids_keep, mask, ids_restore = masking
        else:
            ids_keep, mask, ids_restore = random_masking(
                b, self.num_leads, self.num_patches, mask_ratio, device=patches.device, generator=generator
            )
        return with_sep(gather_tokens(patches, ids_keep), seps), mask, ids_restore

    def forward_masked(
        self,
        x: torch.Tensor,
        mask_ratio: float,
        generator: torch.Generator | None = None,
        masking: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Masked encoder pass used by the autoencoders.

        Returns latent (B, L, K + 2, W) after the final norm (kept tokens in shuffled order between
        the two SEPs), mask (B, L, N) bool True = masked, ids_restore (B, L, N).
        """
        check_mask_ratio(mask_ratio, self.num_patches)
        tokens, mask, ids_restore = self.embed_masked(x, mask_ratio, generator, masking)
        return self._encode_kept(tokens), mask, ids_restore

    def forward_masked_each(
        self, x: torch.Tensor, mask_ratio: float, maskings: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """`forward_masked(x, masking=m)` for each m of `maskings`, with x embedded once: scoring runs
        every record under several fixed masks, and the embedding of all tokens is the same for each."""
        check_mask_ratio(mask_ratio, self.num_patches)
        patches, seps = self.embed(x)
        return [
            (self._encode_kept(with_sep(gather_tokens(patches, ids_keep), seps)), mask, ids_restore)
            for ids_keep, mask, ids_restore in maskings
        ]

    def _encode_kept(self, tokens: torch.Tensor) -> torch.Tensor:
        """Kept tokens (B, L, K + 2, W) -> latent of the same shape, after the blocks and the final norm."""
        b, l, s, w = tokens.shape
        return self.norm(self._run_blocks(tokens.reshape(b, l * s, w))).reshape(b, l, s, w)


class STMEMEncoder(TokenEncoder):
    """ST-MEM encoder over raw ECG windows (B, num_leads, seq_len).

    forward_tokens(x) -> (B, 12 * 32, width); forward_features(x) -> (B, width);
    forward_masked(x, mask_ratio, generator) -> (latent (B, 12, K + 2, width), mask, ids_restore).
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__(cfg)
        self.patch_size = cfg.patch_size
        self.patch_embed = nn.Sequential(
            nn.LayerNorm(cfg.patch_size, eps=1e-6),  # normalises each patch's amplitude profile
            nn.Linear(cfg.patch_size, cfg.width),
            nn.LayerNorm(cfg.width, eps=1e-6),
        )
        self.sep_token = nn.Parameter(torch.zeros(cfg.width))
        self._init_parameters()
        nn.init.normal_(self.sep_token, std=0.02)

    def check_input(self, x: torch.Tensor) -> None:
        """Raise EcgposError unless x is (B, num_leads, seq_len); only static dims are checked."""
        if x.ndim != 3 or x.shape[1] != self.num_leads or x.shape[2] != self.cfg.seq_len:
            raise EcgposError(f"expected ECG input (B, {self.num_leads}, {self.cfg.seq_len}), got {tuple(x.shape)}")

    def embed(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, L, T) -> patch tokens (B, L, N, W), SEP tokens (B, L, 2, W)."""
        self.check_input(x)
        patches = self.patch_embed(patchify(x, self.patch_size))
        patches = patches + self.pos_embed[None, None] + self.lead_embed[None, :, None]
        sep = (self.sep_token[None, :] + self.lead_embed)[None, :, None]  # (1, L, 1, W)
        seps = sep.expand(patches.shape[0], -1, 2, -1)
        return patches, seps


def param_count(module: nn.Module) -> int:
    """Number of parameters (for logs and the model card)."""
    return sum(p.numel() for p in module.parameters())
