"""The carving criterion: the push-margin violation of one level on a set of records.

The preprint's label-free depth criterion (limitations appendix): the fraction of perturbed held-out
nominal samples whose reconstruction still violates the Push margin at level l,
    violated(x) = alpha * d(x~, x) > d(x^, x~),    x^ = P_l(x~),
with d the per-sample Euclidean distance of push_pull.py. This module is its one definition; the
trainer's `val_push_violation`, `ecgpos geometry` and `ecgpos carve` all call `record_violations`.

- x, x~ and x^ live where level l's push term lives: at level 0 the signal patches (B, L, N, P), at a
  latent level l >= 1 the patch tokens of level l-1 (B, L, N, W); both in the loss's target space
  (per-patch normalised when that level trains with norm_target).
- x~ = perturb(x) with level l's push-pull perturbation and scale (PushPullConfig's defaults when the
  level trained without push-pull), drawn for each window on its own: its random numbers come from a
  generator seeded by (seed, record id, window number), and a 'gaussian' std is the window's own. So
  a record's answer depends neither on the batch it comes in, nor on the batch order, nor on how
  many processes share the records.
- P_l is the level's unmasked reconstruction map: its encoder with every token visible, then its
  decoder (the map a push term of that level trains). At level 0, x~ goes back to signal form
  (unpatchify) and through the level-0 encoder and decoder; the SEP outputs of a latent level stay
  unperturbed (latent_mae.py says why).
- A record's value is the mean over its windows; the criterion is the mean over records (each
  record weighs the same).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch

from ecgpos.objectives.level import LevelObjective
from ecgpos.objectives.push_pull import PushPullConfig, perturbation_noise, push_margin_violated

CRITERION_SEED = 0


def criterion_settings(model: LevelObjective) -> PushPullConfig:
    """The push-pull settings the criterion uses for a level: its own when it trains with push-pull,
    PushPullConfig's defaults otherwise."""
    return model.push_pull if model.push_pull.enabled else PushPullConfig()


def window_generator(seed: int, record_id: str, window: int) -> torch.Generator:
    """A CPU generator seeded by (seed, record id, window number): the same stream on any machine."""
    digest = hashlib.blake2b(f"{seed}\x00{record_id}\x00{window}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))


@torch.no_grad()
def push_triplet(
    model: LevelObjective, x: torch.Tensor, generators: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(clean, perturbed, reconstruction of perturbed) of one level's objective on raw windows
    x (B, leads, T), in that level's target space (see the module docstring). The level's own
    `perturb_patches` and `reconstruct` do the work: the perturbation and the map its push term uses."""
    pp, e = criterion_settings(model), model.encoder
    # level 0 perturbs signal patches (P samples each), a latent level the patch tokens below it (W wide)
    inputs = model.level_inputs(x)
    shape = (1, e.num_leads, e.num_patches, model.patch_dim)
    tilde = torch.cat(
        [
            model.perturb_patches(one, noise=perturbation_noise(shape, pp.perturbation, g, x.device))
            for one, g in zip(inputs.split(1), generators)
        ]
    )
    return model.target(inputs), model.target(tilde), model.reconstruct(tilde)


@torch.no_grad()
def window_violations(
    model: LevelObjective, x: torch.Tensor, windows: Sequence[tuple[str, int]], seed: int = CRITERION_SEED
) -> torch.Tensor:
    """(B,) bool: the Push margin violated for each window of x (B, leads, T); `windows` names each
    as (record id, window number), which fixes its perturbation."""
    generators = [window_generator(seed, record, k) for record, k in windows]
    clean, tilde, x_hat = push_triplet(model, x, generators)
    return push_margin_violated(clean, tilde, x_hat, criterion_settings(model).alpha)


def record_violations(
    model: LevelObjective,
    batches: Iterable[tuple[Sequence[tuple[str, int]], torch.Tensor]],
    seed: int = CRITERION_SEED,
) -> dict[str, float]:
    """Record id -> the fraction of its windows violating the Push margin, over batches of
    (window names, windows (B, leads, T)); the windows of a record may spread over batches."""
    hits: dict[str, list[float]] = {}
    for names, x in batches:
        for (record, _), v in zip(names, window_violations(model, x, names, seed).tolist()):
            hits.setdefault(record, []).append(float(v))
    return {record: float(np.mean(v)) for record, v in hits.items()}


def criterion(per_record: Mapping[str, float]) -> float:
    """The criterion of a level: the mean of its records' violation fractions (NaN without records)."""
    return float(np.mean(list(per_record.values()))) if per_record else float("nan")


def bootstrap_interval(
    per_record: Mapping[str, float], level: float = 0.95, resamples: int = 2000, seed: int = CRITERION_SEED
) -> tuple[float, float]:
    """Percentile bootstrap interval of the criterion over records (records resampled with replacement)."""
    values = np.asarray(list(per_record.values()), dtype=np.float64)
    if values.size == 0:
        return float("nan"), float("nan")
    draws = np.random.default_rng(seed).integers(0, values.size, size=(resamples, values.size))
    means = values[draws].mean(axis=1)
    tail = (1.0 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))
