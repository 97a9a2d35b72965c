"""Level l >= 1 (nested manifold carving): a masked autoencoder of the same form on the frozen tokens
of levels 0..l-1 (the base: Level 0 alone for level 1, a nested encoder above).

The frozen base maps x (B, 12, 2250) to latent tokens (B, 12 * 32, W). Level l treats
them like level 0 treats signal patches: per lead, its 30 latent patch tokens are masked at random
(keep int(30 * (1 - mask_ratio))), the two SEP outputs of the lead are always kept and
serve as that lead's SEP tokens, a LatentEncoder (same blocks/embeddings as STMEMEncoder, W wide)
encodes the visible tokens, and the per-lead decoder reconstructs the masked latent tokens
(MSE on masked tokens; targets optionally normalised per token). "level 0" / "level 1" below read
as "the base" / "this level" for any l.

Three named steps, as in MAE (the members of `LevelObjective`, level.py), on the base's tokens
tokens = level_inputs(x) (B, L * (N + 2), W):
    forward_encoder(tokens, noise)        -> latent (B, L, K+2, W), mask (B, L, N), ids_restore (B, L, N)
    forward_decoder(latent, ids_restore)  -> pred (B, L, N, W)
    forward_loss(tokens, pred, mask)      -> loss (scalar), target (B, L, N, W)

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

from ecgpos.models.decoder import DecoderConfig
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.nested import NestedEncoder, check_levels_fit, nested_of
from ecgpos.models.st_mem import STMEMEncoder
from ecgpos.objectives.level import LevelObjective
from ecgpos.objectives.push_pull import PushPullConfig, push_pull_loss


class LatentMaskedAutoencoder(LevelObjective):
    """level-1 objective: raw x (B, 12, 2250) -> dict(loss, log, pred, target, mask);
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
        check_levels_fit(base.cfg, encoder.cfg, "the base encoder")
        level = len(base.levels) if isinstance(base, NestedEncoder) else 1
        super().__init__(encoder, decoder, encoder.width, mask_ratio, norm_target, push_pull, base, level)
        self.base.requires_grad_(False)
        self.base.eval()
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

    def level_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """A latent level reads the frozen base's tokens: x (B, L, T) -> (B, L * (N + 2), W) float32."""
        return self.latent_tokens(x)

    def _by_lead(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, L * (N + 2), W) -> (B, L, N + 2, W): per lead, its SEP output, N patch tokens, SEP output."""
        e = self.encoder
        return tokens.reshape(-1, e.num_leads, e.tokens_per_lead, e.width)

    def patches(self, inputs: torch.Tensor) -> torch.Tensor:
        """Tokens (B, L * (N + 2), W) -> the patch tokens (B, L, N, W) (SEP outputs dropped)."""
        return self._by_lead(inputs)[:, :, 1:-1]

    def with_patches(self, inputs: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        """Tokens (B, L * (N + 2), W) with their patch tokens replaced by `patches` (B, L, N, W); the
        SEP outputs stay as they are (see the module docstring)."""
        t = self._by_lead(inputs)
        return torch.cat([t[:, :, :1], patches.to(t.dtype), t[:, :, -1:]], dim=2).flatten(1, 2)

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
        latent, mask, ids_restore = self.forward_encoder(tokens, noise)
        pred = self.forward_decoder(latent, ids_restore)
        recon, target = self.forward_loss(tokens, pred, mask)
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

    def nested_encoder(self) -> NestedEncoder:
        """Levels 0..l (the base, then this level's encoder; no masking), sharing this model's modules."""
        below = list(self.base.levels) if isinstance(self.base, NestedEncoder) else [self.base]
        return nested_of([*below, self.encoder])


def _two_level_base_names(module: nn.Module, state: dict, prefix: str, *args: object) -> None:
    """load_state_dict pre-hook: a two-level run's "stage0.*" weights are the base's."""
    for key in [k for k in state if k.startswith(prefix + "stage0.")]:
        state[prefix + "base." + key[len(prefix + "stage0.") :]] = state.pop(key)
