"""The perturbation families of the calibrated carving criterion (ecgpos.objectives.calibrated).

A family draws a direction e in a level's perturbable patches (B, L, N, D): at level 0 the signal patches
(N patches of D samples per lead), at a latent level the patch tokens of the level below (D = their
width). The criterion then scales e so that the perturbed input lies at the calibrated distance from the
clean one in the level's target space. The families:

- `gaussian`: independent noise per value, N(0, 1) times the window's own std of each coordinate (the
  push-pull perturbation's shape). A masked predictor cannot carry it: a hidden patch's own noise is in
  no visible patch, so under the masked map it reads about 0 whatever the level.
- `lowfreq` (level 0): a smooth offset per lead, sum of sinusoids of 1, 2 and 3 cycles per window (0.1 to
  0.3 Hz at 9 s), random amplitudes and phases: baseline wander, which visible patches carry to hidden ones.
- `gain` (level 0 without norm_target): a lead-wide gain and baseline change.
- `principal` (every level): one shift of every patch of the window along the leading principal directions
  of the held-out patches (at a latent level, tokens), N(0, lambda_j) along direction j: the directions in
  which the level's own inputs vary most, repeated in every patch, so visible patches carry it to hidden
  ones. At a level trained on per-patch normalised targets the directions are those of the patches with
  each patch's mean removed: the part of a patch such a level models.

A level trained on per-patch normalised targets is read in its patches' units with each patch's own mean
and std (ecgpos.objectives.calibrated), so what it discards by construction, a patch's level and scale,
passes through: `lowfreq` (mostly a slow offset) reads near 1 there and `gain` is left out. The deciding
family is therefore `principal` at every level: a change of the patches' shape, the part every level models.

DECIDING names the family whose reading drives `ecgpos carve`'s decision.
"""

from __future__ import annotations

import math

import torch

from ecgpos.objectives.level import LevelObjective

GAUSSIAN = "gaussian"
LOWFREQ = "lowfreq"
GAIN = "gain"
PRINCIPAL = "principal"
PRINCIPAL_DIRECTIONS = 4  # k: the leading directions a `principal` shift moves along
DECIDING = PRINCIPAL


def level_families(model: LevelObjective) -> tuple[str, ...]:
    """The families measured at this level, the deciding one first."""
    if model.is_latent:
        return (PRINCIPAL, GAUSSIAN)
    return (PRINCIPAL, LOWFREQ, GAUSSIAN) if model.norm_target else (PRINCIPAL, LOWFREQ, GAIN, GAUSSIAN)


def deciding_family(model: LevelObjective) -> str:
    """The family whose reading decides `ecgpos carve` at this level: the same at every level (above)."""
    return DECIDING


def direction(
    family: str, patches: torch.Tensor, generator: torch.Generator, basis: tuple[torch.Tensor, torch.Tensor] | None
) -> torch.Tensor:
    """A direction (1, L, N, D) of `family` for one window's patches (1, L, N, D), drawn from `generator`
    (CPU) and moved to the patches' device. `basis`: (directions (D, k), variances (k,)) for `principal`."""
    _, leads, n, d = patches.shape
    x = patches.float()
    if family == GAUSSIAN:
        std = x.flatten(0, -2).std(dim=0)
        return torch.randn(tuple(patches.shape), generator=generator).to(x.device) * std
    if family == LOWFREQ:
        t = torch.arange(n * d, dtype=torch.float64) / (n * d)
        amp = torch.randn(leads, 3, generator=generator, dtype=torch.float64)
        phase = torch.rand(leads, 3, generator=generator, dtype=torch.float64) * 2 * math.pi
        cycles = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        wave = (amp[:, :, None] * torch.sin(2 * math.pi * cycles[None, :, None] * t + phase[:, :, None])).sum(1)
        return wave.float().reshape(1, leads, n, d).to(x.device)
    if family == GAIN:
        gain = torch.randn(1, leads, 1, 1, generator=generator).to(x.device)
        shift = torch.randn(1, leads, 1, 1, generator=generator).to(x.device)
        lead_std = x.flatten(2).std(dim=-1)[:, :, None, None]
        return gain * x + shift * lead_std
    if family == PRINCIPAL:
        if basis is None:
            raise ValueError("the principal family needs the held-out tokens' principal directions")
        vectors, variances = basis
        g = torch.randn(variances.shape[0], generator=generator, dtype=torch.float64)
        shift = vectors @ (g * variances.clamp_min(0).sqrt())
        return shift.float().to(x.device).expand(1, leads, n, d).clone()
    raise ValueError(f"unknown perturbation family {family!r}")


class TokenMoments:
    """Running first and second moments of token vectors (D,), for the principal directions."""

    def __init__(self, centred: bool = False) -> None:
        self.centred = centred  # each row's own mean removed first (a level with per-patch normalised targets)
        self.count = 0
        self.total: torch.Tensor | None = None
        self.outer: torch.Tensor | None = None

    def add(self, patches: torch.Tensor) -> None:
        rows = patches.detach().double().reshape(-1, patches.shape[-1]).cpu()
        if self.centred:
            rows = rows - rows.mean(dim=-1, keepdim=True)
        self.count += rows.shape[0]
        self.total = rows.sum(0) if self.total is None else self.total + rows.sum(0)
        self.outer = rows.T @ rows if self.outer is None else self.outer + rows.T @ rows

    def principal(self, k: int = PRINCIPAL_DIRECTIONS) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(the leading k eigenvectors (D, k), their variances (k,)) of the tokens' covariance."""
        if self.count < 2 or self.total is None or self.outer is None:
            return None
        mean = self.total / self.count
        cov = (self.outer - self.count * torch.outer(mean, mean)) / (self.count - 1)
        values, vectors = torch.linalg.eigh(cov)
        k = min(k, values.shape[0])
        return vectors[:, -k:].flip(-1), values[-k:].flip(-1)
