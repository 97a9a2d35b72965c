"""Level 0 objective: ST-MEM masked autoencoder around an `STMEMEncoder`.

Three steps, as in MAE:
    forward_encoder(x, noise)        -> latent (B, L, K+2, W), mask (B, L, N), ids_restore (B, L, N)
    forward_decoder(latent, ids)     -> pred (B, L, N, P)
    forward_loss(x, pred, mask)      -> loss (scalar), target (B, L, N, P)
The random numbers of a forward come from `draw_noise` (a generator's draw, outside `forward` when the
caller passes them in, so a compiled forward is a single graph). The decoder is
`ecgpos.models.decoder.PerLeadDecoder`; level 1 reuses it with the latent width as
its output size, and `masked_mse` / `normalise_tokens` as its loss.

Optional Dynamic Push and Pull at level 0 (the paper's AE-PP, push_pull.py), in signal space:
x = the signal patches, x~ = perturb(x) (patches perturbed, the signal reassembled from them),
x^ = P(x~) with P the unmasked encoder + decoder; loss = recon + lambda_pp * L_PP, distances in the
reconstruction loss's target space, as at the latent levels.
"""

from __future__ import annotations

import torch
from torch import nn

from ecgpos.models.decoder import DecoderConfig, PerLeadDecoder
from ecgpos.models.masking import check_mask_ratio, masking_from_noise
from ecgpos.models.st_mem import STMEMEncoder, patchify, unpatchify
from ecgpos.objectives.push_pull import (
    PushPullConfig,
    forward_noise,
    perturb,
    push_pull_loss,
)

TARGET_EPS = 1e-6


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


def masked_mse_per_sample(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """masked_mse of each sample on its own: pred, target (B, L, N, D), mask (B, L, N) -> (B,) float32."""
    per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)
    weights = mask.to(per_patch.dtype)
    return (per_patch * weights).sum(dim=(1, 2)) / weights.sum(dim=(1, 2)).clamp_min(1.0)


class MaskedECGAutoencoder(nn.Module):
    """ST-MEM masked autoencoder: x (B, 12, 2250) -> dict(loss, pred, target, mask).

    pred/target (B, 12, 30, 75) are in normalised-patch units when norm_target (the default);
    `to_signal_units(x, pred)` maps pred back to the input's units for figures.
    """

    def __init__(
        self,
        encoder: STMEMEncoder,
        decoder: DecoderConfig,
        mask_ratio: float = 0.75,
        norm_target: bool = True,
        push_pull: PushPullConfig | None = None,
    ) -> None:
        super().__init__()
        check_mask_ratio(mask_ratio, encoder.num_patches)
        self.encoder = encoder
        self.decoder_cfg = decoder
        self.mask_ratio = float(mask_ratio)
        self.norm_target = bool(norm_target)
        self.push_pull = push_pull if push_pull is not None else PushPullConfig()
        self.decoder = PerLeadDecoder(
            encoder.width, decoder, encoder.num_leads, encoder.num_patches, encoder.patch_size
        )

    def draw_noise(
        self, batch: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The random numbers of one forward over `batch` samples: {"mask": (B, L, N) uniform} and,
        with push-pull on, {"perturb": the perturbation's noise for the (B, L, N, P) signal patches}."""
        return forward_noise(self.encoder, self.push_pull, batch, self.encoder.patch_size, generator, device)

    def perturb_patches(
        self, x: torch.Tensor, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x (B, L, T) with the push-pull perturbation (`noise`, or drawn from `generator`) on its patches."""
        pp = self.push_pull if self.push_pull.enabled else PushPullConfig()
        patches = patchify(x, self.encoder.patch_size)
        return unpatchify(perturb(patches, pp.perturbation, pp.scale, generator, noise))

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        """P(x) without masking: (B, L, T) -> prediction of all patches (B, L, N, P) in the target space."""
        e = self.encoder
        latent = e.forward_tokens(x).reshape(-1, e.num_leads, e.tokens_per_lead, e.width)
        return self.decoder(latent, None)

    def forward_encoder(
        self, x: torch.Tensor, noise: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, L, T) -> latent (B, L, K+2, W), mask (B, L, N) bool, ids_restore (B, L, N)."""
        masking = masking_from_noise(noise["mask"], self.mask_ratio)
        return self.encoder.forward_masked(x, self.mask_ratio, masking=masking)

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
        """latent (B, L, K+2, W), ids_restore (B, L, N) -> pred (B, L, N, P)."""
        return self.decoder(latent, ids_restore)

    def target(self, x: torch.Tensor) -> torch.Tensor:
        """Reconstruction target (B, L, N, P): patches, normalised per patch if norm_target."""
        patches = patchify(x, self.encoder.patch_size)
        return normalise_tokens(patches) if self.norm_target else patches

    def forward_loss(
        self, x: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MSE over masked patches only -> (loss scalar float32, target (B, L, N, P))."""
        target = self.target(x)
        return masked_mse(pred, target, mask), target

    def forward(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        noise: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """x (B, L, T) -> {"loss": (), "log": {}, "pred": (B,L,N,P), "target": (B,L,N,P), "mask": (B,L,N) bool}.

        "log" holds the scalar terms beside "loss" that the trainer records (none for level 0).
        `noise` is `draw_noise(B)`'s output; without it the forward draws its own from `generator`."""
        if noise is None:
            noise = self.draw_noise(x.shape[0], generator, x.device)
        latent, mask, ids_restore = self.forward_encoder(x, noise)
        pred = self.forward_decoder(latent, ids_restore)
        loss, target = self.forward_loss(x, pred, mask)
        log: dict[str, torch.Tensor] = {}
        pp = self.push_pull
        if pp.enabled:
            x_tilde = self.perturb_patches(x, noise=noise["perturb"])
            pp_loss, active = push_pull_loss(target, self.target(x_tilde), self.reconstruct(x_tilde), pp.alpha)
            log["recon_loss"] = loss
            loss = loss + pp.lambda_pp * pp_loss
            log["pp_loss"], log["push_active"] = pp_loss, active
        return {"loss": loss, "log": log, "pred": pred, "target": target, "mask": mask}

    @torch.no_grad()
    def masked_errors(
        self, x: torch.Tensor, maskings: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Per-sample masked reconstruction error (M, B) under each of M given masks, in the loss's
        target space; x's embedding and target are computed once for all masks."""
        target = self.target(x)
        return torch.stack([masked_mse_per_sample(p, target, mask) for p, mask in self.masked_predictions(x, maskings)])

    @torch.no_grad()
    def masked_predictions(
        self, x: torch.Tensor, maskings: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(prediction of every patch (B, L, N, P), mask (B, L, N)) under each given mask, x (B, L, T)
        embedded once: what `ecgpos score` and the criterion's masked map read."""
        return [
            (self.forward_decoder(latent, ids_restore), mask)
            for latent, mask, ids_restore in self.encoder.forward_masked_each(x, self.mask_ratio, maskings)
        ]

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
