"""Level 0 objective: ST-MEM masked autoencoder around an `STMEMEncoder`.

Three steps, as in MAE:
    forward_encoder(x, noise)        -> latent (B, L, K+2, W), mask (B, L, N), ids_restore (B, L, N)
    forward_decoder(latent, ids)     -> pred (B, L, N, P)
    forward_loss(x, pred, mask)      -> loss (scalar), target (B, L, N, P)
The named steps and every other member are those of the declared interface `LevelObjective` (level.py),
which this class fills in for the signal. The random numbers of a forward come from `draw_noise` (a
generator's draw, outside `forward` when the caller passes them in, so a compiled forward is a single
graph). The decoder is `ecgpos.models.decoder.PerLeadDecoder`; level 1 reuses it with the latent width as
its output size, and `masked_mse` / `normalise_tokens` as its loss.

Optional Dynamic Push and Pull at level 0 (the paper's AE-PP, push_pull.py), in signal space:
x = the signal patches, x~ = perturb(x) (patches perturbed, the signal reassembled from them),
x^ = P(x~) with P the unmasked encoder + decoder; loss = recon + lambda_pp * L_PP, distances in the
reconstruction loss's target space, as at the latent levels.
"""

from __future__ import annotations

import torch

from ecgpos.models.decoder import DecoderConfig
from ecgpos.models.st_mem import STMEMEncoder, patchify, unpatchify
from ecgpos.objectives.level import (
    TARGET_EPS,
    LevelObjective,
    masked_mse,
    masked_mse_per_sample,
    normalise_tokens,
)
from ecgpos.objectives.push_pull import PushPullConfig, push_pull_loss

__all__ = [
    "TARGET_EPS",
    "MaskedECGAutoencoder",
    "masked_mse",
    "masked_mse_per_sample",
    "normalise_tokens",
]


class MaskedECGAutoencoder(LevelObjective):
    """ST-MEM masked autoencoder: x (B, 12, 2250) -> dict(loss, pred, target, mask).

    pred/target (B, 12, 30, 75) are in normalised-patch units when norm_target (the default);
    `in_patch_units(inputs, pred)` maps pred back to the signal's units (figures, the calibrated criterion).
    """

    def __init__(
        self,
        encoder: STMEMEncoder,
        decoder: DecoderConfig,
        mask_ratio: float = 0.75,
        norm_target: bool = True,
        push_pull: PushPullConfig | None = None,
    ) -> None:
        super().__init__(encoder, decoder, encoder.patch_size, mask_ratio, norm_target, push_pull)

    def level_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Level 0 reads the signal itself: x (B, L, T) as float32."""
        return x.float()

    def patches(self, inputs: torch.Tensor) -> torch.Tensor:
        """Signal (B, L, T) -> its patches (B, L, N, P)."""
        return patchify(inputs, self.encoder.patch_size)

    def with_patches(self, inputs: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        """The signal (B, L, T) the patches (B, L, N, P) make up (every sample of the signal is in a patch)."""
        return unpatchify(patches)

    def nested_encoder(self) -> STMEMEncoder:
        """Level 0 alone: its STMEMEncoder."""
        return self.encoder

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
