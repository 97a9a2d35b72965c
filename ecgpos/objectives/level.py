"""The declared interface of one level's objective: a masked autoencoder on the level's inputs.

Level 0 (`MaskedECGAutoencoder`) reads the signal; a latent level l >= 1 (`LatentMaskedAutoencoder`)
reads the tokens of its frozen base, levels 0..l-1. Both are a `LevelObjective`, so the trainer, the
criteria (criterion.py, calibrated.py), `ecgpos score` and the probes read either through the members
below, never by probing for attributes. Shapes: B windows, L leads, N patches per lead, D the width of
one perturbable patch (P signal samples at level 0, the base's width W at a latent level), K visible
patches per lead.

    level_inputs(x (B, L, T))                 -> inputs: x itself at level 0, the base's tokens
                                                 (B, L * (N + 2), W) at a latent level
    patches(inputs)                           -> perturbable patches (B, L, N, D)
    with_patches(inputs, patches (B, L, N, D)) -> inputs with those patches put back
    target(inputs)                            -> reconstruction target (B, L, N, D)
    forward_encoder(inputs, noise)            -> latent (B, L, K + 2, W), mask (B, L, N), ids_restore (B, L, N)
    forward_decoder(latent, ids_restore)      -> pred (B, L, N, D)
    forward_loss(inputs, pred, mask)          -> loss (scalar float32), target (B, L, N, D)
    reconstruct(inputs)                       -> the unmasked map P(inputs) (B, L, N, D)
    reconstruct_through(inputs, map)          -> P through the map named 'unmasked' or 'masked'
    masked_errors(x, maskings)                -> per-sample masked error (M, B): what `ecgpos score` reads
    nested_encoder()                          -> levels 0..l as one encoder (no masking)
"""

from __future__ import annotations

import abc

import torch
from torch import nn

from ecgpos.models.decoder import DecoderConfig, PerLeadDecoder
from ecgpos.models.masking import check_mask_ratio, expand_masking, masking_from_noise, score_maskings
from ecgpos.objectives.push_pull import PushPullConfig, forward_noise, perturb

MAP_NAMES = ("masked", "unmasked")
SCORE_MASKS = 8  # `ecgpos score`'s default --masks: the fixed masks of the masked map

Maskings = list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


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


class LevelObjective(nn.Module, abc.ABC):
    """One level's masked autoencoder: `encoder` and `decoder` over the level's inputs (see the module
    docstring for the members and their shapes).

    Declared attributes: `level` (0 for the signal level), `encoder`, `decoder`, `mask_ratio`,
    `norm_target` (targets normalised per patch), `push_pull` (the level's PushPullConfig; a disabled
    one when the level trains without push-pull) and `base` (the frozen levels below, None at level 0).
    """

    level: int
    encoder: nn.Module
    decoder: nn.Module
    mask_ratio: float
    norm_target: bool
    push_pull: PushPullConfig
    base: nn.Module | None

    def __init__(
        self,
        encoder: nn.Module,
        decoder: DecoderConfig,
        out_dim: int,
        mask_ratio: float,
        norm_target: bool,
        push_pull: PushPullConfig | None,
        base: nn.Module | None = None,
        level: int = 0,
    ) -> None:
        """The members every level sets alike; `out_dim` is the size the decoder predicts per patch."""
        super().__init__()
        check_mask_ratio(mask_ratio, encoder.num_patches)
        self.base = base  # registered before the encoder: a latent level's state dict lists base.* first
        self.level = level
        self.encoder = encoder
        self.decoder_cfg = decoder
        self.mask_ratio = float(mask_ratio)
        self.norm_target = bool(norm_target)
        self.push_pull = push_pull if push_pull is not None else PushPullConfig()
        self.decoder = PerLeadDecoder(encoder.width, decoder, encoder.num_leads, encoder.num_patches, out_dim)

    @property
    def is_latent(self) -> bool:
        """Whether this level reads the tokens of frozen levels below (level >= 1) rather than the signal."""
        return self.base is not None

    @property
    def patch_dim(self) -> int:
        """D: the size of one perturbable patch (signal samples at level 0, token width above)."""
        return self.encoder.width if self.is_latent else self.encoder.patch_size

    @property
    def trained_map(self) -> str:
        """The map this level's loss trains: 'unmasked' with push-pull on, 'masked' without it."""
        return "unmasked" if self.push_pull.enabled else "masked"

    @abc.abstractmethod
    def level_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """Raw windows x (B, L, T) -> this level's inputs (the signal, or the frozen base's tokens)."""

    @abc.abstractmethod
    def patches(self, inputs: torch.Tensor) -> torch.Tensor:
        """The level's inputs -> its perturbable patches (B, L, N, D)."""

    @abc.abstractmethod
    def with_patches(self, inputs: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        """The level's inputs with their perturbable patches replaced by `patches` (B, L, N, D)."""

    @abc.abstractmethod
    def nested_encoder(self) -> nn.Module:
        """Levels 0..level as one encoder without masking, sharing this objective's modules."""

    def target(self, inputs: torch.Tensor) -> torch.Tensor:
        """Reconstruction target (B, L, N, D): the patches, normalised per patch if norm_target."""
        patches = self.patches(inputs)
        return normalise_tokens(patches) if self.norm_target else patches

    @torch.no_grad()
    def in_patch_units(self, inputs: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
        """pred (B, L, N, D) in the target space -> the units of the inputs' patches, per-patch
        normalisation undone with each input patch's own mean and std (identity without norm_target)."""
        if not self.norm_target:
            return pred
        patches = self.patches(inputs).float()
        mean = patches.mean(dim=-1, keepdim=True)
        std = torch.sqrt(patches.var(dim=-1, keepdim=True, unbiased=False) + TARGET_EPS)
        return pred.float() * std + mean

    def draw_noise(
        self, batch: int, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The random numbers of one forward over `batch` samples: {"mask": (B, L, N) uniform} and,
        with push-pull on, {"perturb": the perturbation's noise for the (B, L, N, D) patches}."""
        return forward_noise(self.encoder, self.push_pull, batch, self.patch_dim, generator, device)

    def perturb_patches(
        self, inputs: torch.Tensor, generator: torch.Generator | None = None, noise: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The inputs with the push-pull perturbation (`noise`, or drawn from `generator`) on their
        perturbable patches; whatever else the inputs hold (a latent level's SEP outputs) stays as it is."""
        pp = self.push_pull if self.push_pull.enabled else PushPullConfig()
        return self.with_patches(inputs, perturb(self.patches(inputs), pp.perturbation, pp.scale, generator, noise))

    def forward_encoder(
        self, inputs: torch.Tensor, noise: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """inputs -> latent (B, L, K+2, W), mask (B, L, N) bool True = hidden, ids_restore (B, L, N)."""
        masking = masking_from_noise(noise["mask"], self.mask_ratio)
        return self.encoder.forward_masked(inputs, self.mask_ratio, masking=masking)

    def forward_decoder(self, latent: torch.Tensor, ids_restore: torch.Tensor | None) -> torch.Tensor:
        """latent (B, L, K+2, W), ids_restore (B, L, N) (None: every patch visible) -> pred (B, L, N, D)."""
        return self.decoder(latent, ids_restore)

    def forward_loss(
        self, inputs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MSE over the hidden patches only -> (loss scalar float32, target (B, L, N, D))."""
        target = self.target(inputs)
        return masked_mse(pred, target, mask), target

    def reconstruct(self, inputs: torch.Tensor) -> torch.Tensor:
        """The unmasked map P(inputs): every patch visible to the encoder, then the decoder -> (B, L, N, D)."""
        e = self.encoder
        latent = e.forward_tokens(inputs).reshape(-1, e.num_leads, e.tokens_per_lead, e.width)
        return self.forward_decoder(latent, None)

    @torch.no_grad()
    def masked_predictions(self, inputs: torch.Tensor, maskings: Maskings) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(prediction of every patch (B, L, N, D), mask (B, L, N)) under each given mask, the inputs
        embedded once: what `ecgpos score` and the masked map read."""
        return [
            (self.forward_decoder(latent, ids_restore), mask)
            for latent, mask, ids_restore in self.encoder.forward_masked_each(inputs, self.mask_ratio, maskings)
        ]

    @torch.no_grad()
    def reconstruct_masked(self, inputs: torch.Tensor, masks: int = SCORE_MASKS) -> torch.Tensor:
        """The masked map: each patch predicted while hidden, averaged over `ecgpos score`'s fixed masks
        (ecgpos.models.masking.score_maskings); a patch hidden under none keeps the mean of its
        visible predictions -> (B, L, N, D)."""
        e = self.encoder
        fixed = score_maskings(e.num_leads, e.num_patches, self.mask_ratio, masks)
        preds = self.masked_predictions(inputs, [expand_masking(m, len(inputs), inputs.device) for m in fixed])
        hidden = torch.stack([m.float() for _, m in preds])[..., None]  # (M, B, L, N, 1)
        values = torch.stack([p.float() for p, _ in preds])
        count = hidden.sum(0)
        return torch.where(count > 0, (values * hidden).sum(0) / count.clamp_min(1), values.mean(0))

    def reconstruct_through(self, inputs: torch.Tensor, map_name: str, masks: int = SCORE_MASKS) -> torch.Tensor:
        """The reconstruction of the inputs through the map named `map_name` ('masked' or 'unmasked')."""
        if map_name == "unmasked":
            return self.reconstruct(inputs)
        if map_name == "masked":
            return self.reconstruct_masked(inputs, masks)
        raise ValueError(f"unknown map {map_name!r} (expected one of {', '.join(MAP_NAMES)})")

    @torch.no_grad()
    def masked_errors(self, x: torch.Tensor, maskings: Maskings) -> torch.Tensor:
        """Per-sample masked reconstruction error (M, B) of raw windows x (B, L, T) under each of M given
        masks, in the loss's target space; the inputs and their target are computed once for all masks."""
        inputs = self.level_inputs(x)
        target = self.target(inputs)
        return torch.stack(
            [masked_mse_per_sample(p, target, mask) for p, mask in self.masked_predictions(inputs, maskings)]
        )
