"""Per-lead random masking shared by level 0 (signal patches) and level 1 (latent patch tokens).

Every lead is masked independently: each keeps exactly `num_kept(N, mask_ratio)` of its N patch
tokens (7 of 30 at mask_ratio 0.75, the same integer rule ST-MEM uses), so every lead contributes
the same number of visible tokens and a batch stays a dense tensor. SEP tokens are not part of
the N patch positions, so they are never masked; callers add them back around the kept tokens.
"""

from __future__ import annotations

import torch

from ecgpos.errors import ConfigError


def num_kept(num_patches: int, mask_ratio: float) -> int:
    """Visible patches per lead: int(num_patches * (1 - mask_ratio))."""
    return int(num_patches * (1.0 - mask_ratio))


def check_mask_ratio(mask_ratio: float, num_patches: int) -> None:
    """Raise ConfigError unless 0 < mask_ratio < 1 and each lead keeps and masks >= 1 patch."""
    if not 0.0 < float(mask_ratio) < 1.0:
        raise ConfigError(f"mask_ratio must lie in (0, 1), got {mask_ratio}")
    kept = num_kept(num_patches, mask_ratio)
    if kept < 1 or kept >= num_patches:
        raise ConfigError(
            f"mask_ratio {mask_ratio} keeps {kept} of {num_patches} patches per lead; "
            "each lead must keep at least one patch and mask at least one"
        )


def mask_noise(
    batch: int,
    num_leads: int,
    num_patches: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The random numbers behind a mask: uniform noise (B, L, N), drawn on the generator's device
    (so a CPU generator gives the same mask whatever device the model runs on), then moved to `device`."""
    noise_device = generator.device if generator is not None else device
    return torch.rand(batch, num_leads, num_patches, generator=generator, device=noise_device).to(device)


def masking_from_noise(noise: torch.Tensor, mask_ratio: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The mask that noise (B, L, N) decides: per lead, the patches with the smallest noise are kept.

    Returns
        ids_keep    (B, L, K) int64: indices of the kept patches, in shuffled order,
        mask        (B, L, N) bool: True where the patch is masked (N - K per lead),
        ids_restore (B, L, N) int64: inverse permutation, used by the decoder to unshuffle
                    [kept tokens, mask tokens] back into time order.
    No random draw happens here, so a compiled forward that takes the noise stays one graph.
    """
    keep = num_kept(noise.shape[-1], mask_ratio)
    ids_shuffle = torch.argsort(noise, dim=-1)  # ascending: smallest noise is kept
    ids_restore = torch.argsort(ids_shuffle, dim=-1)
    ids_keep = ids_shuffle[..., :keep]
    mask = torch.ones(noise.shape, dtype=torch.bool, device=noise.device)
    mask[..., :keep] = False
    mask = torch.gather(mask, -1, ids_restore)  # back to time order
    return ids_keep, mask, ids_restore


def random_masking(
    batch: int,
    num_leads: int,
    num_patches: int,
    mask_ratio: float,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An independent random mask per (sample, lead): `masking_from_noise` of fresh `mask_noise`."""
    return masking_from_noise(mask_noise(batch, num_leads, num_patches, generator, device), mask_ratio)


def gather_tokens(tokens: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Select tokens per lead: tokens (B, L, N, D), ids (B, L, K) -> (B, L, K, D)."""
    index = ids.unsqueeze(-1).expand(-1, -1, -1, tokens.shape[-1])
    return torch.gather(tokens, 2, index)


def unshuffle_with_mask_tokens(kept: torch.Tensor, mask_token: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
    """Re-insert mask tokens and restore time order.

    kept (B, L, K, D), mask_token (D,) or broadcastable to (1, 1, 1, D), ids_restore (B, L, N)
    -> (B, L, N, D), where masked positions hold `mask_token`.
    """
    b, l, k, d = kept.shape
    n = ids_restore.shape[-1]
    fill = mask_token.reshape(1, 1, 1, d).to(kept.dtype).expand(b, l, n - k, d)
    full = torch.cat([kept, fill], dim=2)  # shuffled order: kept first
    return gather_tokens(full, ids_restore)


def fixed_masking(
    num_leads: int, num_patches: int, mask_ratio: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One reproducible mask (ids_keep, mask, ids_restore), each (1, L, ...), drawn from `seed`.

    Used for scoring: the same masks for every record, whatever the batch it is scored in.
    """
    return random_masking(1, num_leads, num_patches, mask_ratio, generator=torch.Generator().manual_seed(seed))


def score_maskings(
    num_leads: int, num_patches: int, mask_ratio: float, masks: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The fixed masks `ecgpos score` averages over, mask m drawn from seed m (0..masks-1); the carving
    criterion's masked map averages over the same ones."""
    return [fixed_masking(num_leads, num_patches, mask_ratio, seed) for seed in range(masks)]


def expand_masking(
    masking: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A (1, L, ...) masking repeated over a batch and moved to `device`."""
    return tuple(t.to(device).expand(batch, *t.shape[1:]) for t in masking)  # type: ignore[return-value]
