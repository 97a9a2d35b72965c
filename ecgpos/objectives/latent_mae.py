"""Level l >= 1 (nested manifold carving): a masked autoencoder of the same form on the frozen tokens
of levels 0..l-1 (the base: Level 0 alone for level 1, a nested encoder above).

The frozen base maps x (B, 12, 2250) to latent tokens (B, 12 * 32, W). Level l treats
them like level 0 treats signal patches: per lead, its 30 latent patch tokens are masked at random
(keep int(30 * (1 - mask_ratio))), the two SEP outputs of the lead are always kept and
serve as that lead's SEP tokens, a LatentEncoder (same blocks/embeddings as STMEMEncoder, W wide)
encodes the visible tokens, and the per-lead decoder reconstructs the masked latent tokens
(MSE on masked tokens; targets optionally normalised per token). "level 0" / "level 1" below read
as "the base" / "this level" for any l.

Optional Dynamic Push and Pull on the latent level (push_pull.py): x = level-0 patch tokens,
x~ = perturb(x), x^ = P(x~) with P the unmasked level-1 encoder + decoder;
loss = recon + lambda_pp * L_PP (+ lambda_sp * mean |level-1 latent|).
P reads the lead's two level-0 SEP outputs beside the patch tokens but reconstructs only the patch
tokens, so x, and hence e, are the patch tokens alone: the SEP outputs go into P unperturbed, and
delta = d(x~, x) is the whole perturbation P sees, as the paper's delta_e = d(s~, s) requires.
The paper leaves the sparsity penalty Omega_sp open; here it is the mean |value| of the visible
Level-1 latent patch tokens of the masked pass.
"""

from __future__ import annotations

import torch
from torch import nn

from ecgpos.models.decoder import DecoderConfig, PerLeadDecoder
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.masking import check_mask_ratio, masking_from_noise
from ecgpos.models.nested import NestedEncoder, check_levels_fit
from ecgpos.models.st_mem import STMEMEncoder
from ecgpos.objectives.level0_mae import masked_mse, masked_mse_per_sample, normalise_tokens
from ecgpos.objectives.push_pull import (
    PushPullConfig,
    forward_noise,
    perturb,
    push_pull_loss,
)


class LatentMaskedAutoencoder(nn.Module):
    """Level-1 objective: raw x (B, 12, 2250) -> dict(loss, log, pred, target, mask);
    log = {recon_loss [, pp_loss, push_active] [, sp_loss]} (scalars the trainer records),
    pred/target (B, 12, 30, W), mask (B, 12, 30) bool.

    The base (levels 0..l-1) is frozen here (requires_grad False, kept in eval mode by `train()`),
    runs under torch.no_grad() (no graph) in the caller's precision: the trainer's bf16 autocast in a
    bf16 run, fp32 in an fp32 run, as probes and exports run it. no_grad rather than inference_mode:
    inference tensors cannot enter a compiled training graph, and with no_grad the frozen levels
    compile into the same graph as this level.
    Weights saved with the two-level name "stage0.*" for the base load as "base.*".
    """

    def __init__(
        self,
        base: STMEMEncoder | NestedEncoder,
        encoder: LatentEncoder,
        decoder: DecoderConfig,
        mask_ratio: float = 0.75,
        norm_target: bool = False,
        push_pull: PushPullConfig | None = None,
    ) -> None:
        super().__init__()
        check_levels_fit(base.cfg, encoder.cfg, "the base encoder")
        check_mask_ratio(mask_ratio, encoder.num_patches)
        self.base = base
        self.base.requires_grad_(False)
        self.base.eval()
        self.level = len(base.levels) if isinstance(base, NestedEncoder) else 1
        self.encoder = encoder
        self.decoder_cfg = decoder
        self.mask_ratio = float(mask_ratio)
        self.norm_target = bool(norm_target)
        self.push_pull = push_pull if push_pull is not None else PushPullConfig()
        self.decoder = PerLeadDecoder(encoder.width, decoder, encoder.num_leads, encoder.num_patches, encoder.width)
        self._register_load_state_dict_pre_hook(_two_level_base_names, with_module=True)

    def train(self, mode: bool = True) -> LatentMaskedAutoencoder:
        """Switch this level to train/eval; the base always stays in eval mode (frozen)."""
        super().train(mode)
        self.base.eval()
        return self

    def latent_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """Frozen base tokens: x (B, L, T) -> (B, L * (N + 2), W) float32, no autograd graph."""
        with torch.no_grad():
            return self.base.forward_tokens(x).float()

    def _patch_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L * (N + 2), W) -> latent patch tokens (B, L, N, W) (SEP outputs dropped)."""
        e = self.encoder
        return tokens.reshape(-1, e.num_leads, e.tokens_per_lead, e.width)[:, :, 1:-1]

    def target(self, tokens: torch.Tensor) -> torch.Tensor:
        """Reconstruction target (B, L, N, W): latent patch tokens, normalised per token if norm_target."""
        patches = self._patch_tokens(tokens)
        return normalise_tokens(patches) if self.norm_target else patches

    def draw_noise(
        self, batch: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The random numbers of one forward over `batch` samples: {"mask": (B, L, N) uniform} and,
        with push-pull on, {"perturb": the perturbation's noise for the (B, L, N, W) patch tokens}."""
        return forward_noise(self.encoder, self.push_pull, batch, self.encoder.width, generator, device)

    def perturb_patches(
        self, tokens: torch.Tensor, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Level-0 tokens (B, L*(N+2), W) with the push-pull perturbation (`noise`, or drawn from
        `generator`) on the patch tokens only; the SEP outputs stay as they are (see the module docstring)."""
        pp, e = self.push_pull if self.push_pull.enabled else PushPullConfig(), self.encoder
        t = tokens.reshape(-1, e.num_leads, e.tokens_per_lead, e.width)
        noisy = perturb(t[:, :, 1:-1], pp.perturbation, pp.scale, generator, noise)
        return torch.cat([t[:, :, :1], noisy, t[:, :, -1:]], dim=2).flatten(1, 2)

    def reconstruct(self, tokens: torch.Tensor) -> torch.Tensor:
        """P(tokens) without masking: (B, L*(N+2), W) -> prediction of all patch tokens (B, L, N, W)."""
        latent = self.encoder.forward_tokens(tokens)
        latent = latent.reshape(-1, self.encoder.num_leads, self.encoder.tokens_per_lead, self.encoder.width)
        return self.decoder(latent, None)

    def forward(
        self,
        x: torch.Tensor,
        generator: torch.Generator | None = None,
        noise: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """x (B, L, T) raw ECG -> losses and tensors (see class docstring). `noise` is `draw_noise(B)`'s
        output; without it the forward draws its own from `generator`."""
        if noise is None:
            noise = self.draw_noise(x.shape[0], generator, x.device)
        tokens = self.latent_tokens(x)
        masking = masking_from_noise(noise["mask"], self.mask_ratio)
        latent, mask, ids_restore = self.encoder.forward_masked(tokens, self.mask_ratio, masking=masking)
        pred = self.decoder(latent, ids_restore)
        target = self.target(tokens)
        recon = masked_mse(pred, target, mask)
        log = {"recon_loss": recon}
        loss = recon
        pp = self.push_pull
        if pp.enabled:
            tokens_tilde = self.perturb_patches(tokens, noise=noise["perturb"])
            x_hat = self.reconstruct(tokens_tilde)
            # Distances live in the same (optionally normalised) space the recon loss uses.
            pp_loss, active = push_pull_loss(target, self.target(tokens_tilde), x_hat, pp.alpha)
            loss = loss + pp.lambda_pp * pp_loss
            log["pp_loss"], log["push_active"] = pp_loss, active
        if pp.lambda_sp > 0:
            sp_loss = latent[:, :, 1:-1].float().abs().mean()  # L1 on visible level-1 latent tokens
            loss = loss + pp.lambda_sp * sp_loss
            log["sp_loss"] = sp_loss
        return {"loss": loss, "log": log, "pred": pred, "target": target, "mask": mask}

    @torch.no_grad()
    def masked_errors(
        self, x: torch.Tensor, maskings: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Per-sample masked reconstruction error (M, B) of the level-0 latent tokens under each of M
        given masks, in the loss's target space. The frozen levels below run once for all masks."""
        tokens = self.latent_tokens(x)
        target = self.target(tokens)
        return torch.stack(
            [masked_mse_per_sample(p, target, mask) for p, mask in self.masked_predictions(tokens, maskings)]
        )

    @torch.no_grad()
    def masked_predictions(
        self, tokens: torch.Tensor, maskings: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(prediction of every patch token (B, L, N, W), mask (B, L, N)) under each given mask, from the
        tokens of the levels below (B, L*(N+2), W): what `ecgpos score` and the criterion's masked map read."""
        return [
            (self.decoder(latent, ids_restore), mask)
            for latent, mask, ids_restore in self.encoder.forward_masked_each(tokens, self.mask_ratio, maskings)
        ]

    def nested_encoder(self) -> NestedEncoder:
        """Levels 0..l (the base, then this level's encoder; no masking), sharing this model's modules."""
        below = list(self.base.levels) if isinstance(self.base, NestedEncoder) else [self.base]
        return NestedEncoder([*below, self.encoder])


def _two_level_base_names(module: nn.Module, state: dict, prefix: str, *args: object) -> None:
    """load_state_dict pre-hook: a two-level run's "stage0.*" weights are the base's."""
    for key in [k for k in state if k.startswith(prefix + "stage0.")]:
        state[prefix + "base." + key[len(prefix + "stage0.") :]] = state.pop(key)
