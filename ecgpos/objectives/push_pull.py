"""Dynamic Push and Pull (paper, section "Dynamic push-pull learning", eq. push-pull-loss).

For a clean sample x, a perturbed copy x~ = x + e and the reconstruction x^ = P(x~):
    delta = d(x~, x)
    L_PP  = d(x^, x) + max(0, alpha * delta - d(x^, x~))
with d the per-sample Euclidean distance. The first (pull) term draws the reconstruction of the
perturbed input back to the clean sample; the hinge (push) term keeps it at least alpha * delta
away from the perturbed input, so the model cannot simply reproduce perturbations. alpha = 0
removes the hinge and leaves a denoising objective. The complete objective adds it to the
ordinary reconstruction loss: L = L_recon + lambda_pp * L_PP (+ lambda_sp * sparsity).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ecgpos.errors import ConfigError

PERTURBATIONS = ("gaussian", "mask")


@dataclass
class PushPullConfig:
    """Level-1 push-pull options (off by default).

    perturbation 'gaussian': e ~ N(0, (scale * std_j)^2) per latent dimension j, std_j measured on
    the batch; 'mask': each token is zeroed with probability `scale`. Level 1 perturbs the latent
    patch tokens only (LatentMaskedAutoencoder.perturb_patches).
    lambda_sp weights an L1 sparsity penalty on the level-1 latent (0 = off).
    lambda_pp defaults to 1e-3 because d is a per-sample Euclidean distance over all 360 x width
    latent values (about sqrt(360 * width) times a per-value error), while the reconstruction loss
    is a per-value mean: at width 768 a weight of 1e-3 puts both terms on a similar scale.
    """

    enabled: bool = False
    alpha: float = 1.0
    lambda_pp: float = 1e-3
    perturbation: str = "gaussian"
    scale: float = 0.1
    lambda_sp: float = 0.0

    def __post_init__(self) -> None:
        if self.perturbation not in PERTURBATIONS:
            raise ConfigError(
                f"push_pull.perturbation must be one of {', '.join(PERTURBATIONS)}, got {self.perturbation!r}"
            )
        if self.alpha < 0:
            raise ConfigError(f"push_pull.alpha must be >= 0, got {self.alpha}")
        if self.lambda_pp < 0 or self.lambda_sp < 0:
            raise ConfigError("push_pull.lambda_pp and push_pull.lambda_sp must be >= 0")
        if self.scale <= 0 or (self.perturbation == "mask" and self.scale >= 1):
            raise ConfigError(f"push_pull.scale must be > 0 (and < 1 for 'mask'), got {self.scale}")


def check_perturbation(kind: str) -> None:
    """Raise ConfigError unless `kind` is one of PERTURBATIONS."""
    if kind not in PERTURBATIONS:
        raise ConfigError(f"unknown perturbation {kind!r} (expected one of {', '.join(PERTURBATIONS)})")


def perturbation_noise(
    shape: torch.Size | tuple[int, ...],
    kind: str,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The random numbers `perturb` uses on tokens of `shape` (B, ..., D): N(0, 1) of that shape for
    'gaussian', U(0, 1) per token (shape[:-1]) for 'mask'. Drawn on the generator's device, so a CPU
    generator is reproducible anywhere, then moved to `device`."""
    check_perturbation(kind)
    where = generator.device if generator is not None else device
    if kind == "gaussian":
        return torch.randn(tuple(shape), generator=generator, device=where).to(device)
    return torch.rand(tuple(shape[:-1]), generator=generator, device=where).to(device)


def perturb(
    x: torch.Tensor,
    kind: str,
    scale: float,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Perturbed copy x~ of latent tokens x (B, ..., D); same shape, no gradient to x.

    'gaussian': x + scale * std_j * N(0, 1), std_j the std of dimension j over all other axes,
    so the noise is comparable across latent dimensions of very different spread.
    'mask': tokens (vectors along the last axis) zeroed independently with probability scale.
    `noise` is `perturbation_noise(x.shape, kind)`, drawn from `generator` when not given.
    """
    check_perturbation(kind)
    x = x.detach()
    if noise is None:
        noise = perturbation_noise(x.shape, kind, generator, x.device)
    if kind == "gaussian":
        std = x.float().flatten(0, -2).std(dim=0)  # (D,)
        return (x.float() + scale * std * noise).to(x.dtype)
    return x.masked_fill((noise < scale).unsqueeze(-1), 0.0)


def per_sample_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Euclidean distance between a and b (B, ...) per sample -> (B,), computed in float32."""
    return torch.linalg.vector_norm((a.float() - b.float()).flatten(1), dim=1)


def push_pull_loss(
    x: torch.Tensor, x_tilde: torch.Tensor, x_hat: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """L_PP averaged over the batch, and the fraction of samples whose push hinge is active.

    x (clean), x_tilde (perturbed), x_hat (reconstruction of x_tilde): (B, ...) of equal shape.
    Returns (loss scalar, active_fraction scalar in [0, 1]). Only x_hat carries gradient: delta is a
    fixed margin per sample.
    """
    pull = per_sample_distance(x_hat, x)
    delta = per_sample_distance(x_tilde, x).detach()
    margin = alpha * delta - per_sample_distance(x_hat, x_tilde)
    push = torch.clamp(margin, min=0.0)
    active = (margin > 0).float().mean().detach()
    return (pull + push).mean(), active


def push_margin_violated(x: torch.Tensor, x_tilde: torch.Tensor, x_hat: torch.Tensor, alpha: float) -> torch.Tensor:
    """(B,) bool: alpha * d(x~, x) > d(x^, x~), the samples whose reconstruction still violates the
    Push margin (the preprint's label-free criterion for whether a level needs further carving)."""
    return alpha * per_sample_distance(x_tilde, x) > per_sample_distance(x_hat, x_tilde)


def forward_noise(
    encoder: nn.Module,
    push_pull: PushPullConfig,
    batch: int,
    patch_dim: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, torch.Tensor]:
    """The random numbers of one forward of a level's objective over `batch` samples, drawn in this order:
    {"mask": (B, L, N) uniform} and, with push-pull on, {"perturb": the perturbation's noise for the
    (B, L, N, patch_dim) patches: signal samples at level 0, token widths above}."""
    from ecgpos.models.masking import mask_noise

    noise = {"mask": mask_noise(batch, encoder.num_leads, encoder.num_patches, generator, device)}
    if push_pull.enabled:
        shape = (batch, encoder.num_leads, encoder.num_patches, patch_dim)
        noise["perturb"] = perturbation_noise(shape, push_pull.perturbation, generator, device)
    return noise
