"""The calibrated carving criterion and its continuous companion, pass-through, of one level.

The literal criterion (ecgpos.objectives.criterion) perturbs at a fixed size, so a level whose clean
reconstruction error is large compared with that size reads 0 whatever it does to a perturbation. Here
the size follows the level:

1. eps = the median over the held-out windows of d(P(x), x): the level's clean reconstruction error in
   its target space, through the map P it is read as (below). A level trained on per-patch normalised
   targets (norm_target) is read in its patches' own units instead: each predicted patch is mapped back
   with the input patch's own mean and std (LevelObjective.in_patch_units, the figures' definition). On
   the normalised sphere every window has the same size |x|, and a level near the mean predictor has
   eps ~ |x|: no perturbation lies 2 eps away there, and a map that removes a perturbation would read
   as one that keeps it. In the patches' units both maps read as below at any size. The price, stated
   where the families are: what such a level discards by construction (a patch's level and scale) it
   passes through.
2. Each window gets a perturbation of a family (ecgpos.objectives.perturbations) scaled so that
   d(x~, x) = delta = kappa * eps in that space (KAPPA = 2; the space is linear in the patches, so one
   scaling is exact).
3. The window violates the margin when d(P(x~), x~) < alpha * d(x~, x) with alpha = 1: the reconstruction
   of x~ lies nearer x~ than x does. A map that passes the perturbation through (P(x~) = P(x) + e) has
   d(P(x~), x~) = d(P(x), x), below delta for every window whose error is under kappa times the median:
   it reads 1. A map that removes it (P(x~) = P(x)) has d(P(x~), x~) ~ sqrt(d(P(x), x)^2 + delta^2) >= delta:
   it reads 0. At alpha > 1 a removing map would violate too, hence alpha 1 whatever the level trained with.
4. Pass-through rho = d(P(x~), P(x)) / d(x~, x) per window: 0 when the level removes the perturbation,
   1 when it reproduces it.

Records weigh equally: a record's value is the mean over its windows, the criterion the mean over records.

The map P: `unmasked` is the encoder with every token visible, then the decoder (the map a push term
trains); `masked` predicts each patch while it is hidden, averaged over the fixed masks `ecgpos score`
uses (ecgpos.models.masking.score_maskings; a patch hidden under none of them keeps the mean of its
visible predictions). `trained` (the default) is the one the level's loss trained: unmasked with
push-pull on, masked without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ecgpos.objectives.criterion import CRITERION_SEED, window_generator
from ecgpos.objectives.level import SCORE_MASKS, LevelObjective
from ecgpos.objectives.perturbations import TokenMoments, deciding_family, direction, level_families
from ecgpos.objectives.push_pull import per_sample_distance

KAPPA = 2.0
MAPS = ("trained", "masked", "unmasked")
MASKS = SCORE_MASKS  # `ecgpos score`'s default --masks
EPS_FLOOR = 1e-3  # eps is at least this fraction of the median target size

Batches = Callable[[], Iterable[tuple[Sequence[tuple[str, int]], torch.Tensor]]]


@dataclass
class LevelView:
    """One level as the criterion reads it, as functions of the level's inputs (signal or tokens)."""

    inputs: Callable[[torch.Tensor], torch.Tensor]  # raw windows (B, leads, T) -> the level's inputs
    patches: Callable[[torch.Tensor], torch.Tensor]  # inputs -> perturbable patches (B, L, N, D)
    with_patches: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # inputs, new patches -> inputs
    target: Callable[[torch.Tensor], torch.Tensor]  # inputs -> target space
    map: Callable[[torch.Tensor], torch.Tensor]  # inputs -> reconstruction in the target space
    centred: bool = False  # the level models each patch without its mean: principal directions of centred patches


def map_kind(model: LevelObjective, choice: str = "trained") -> str:
    """`masked` or `unmasked`: the map `choice` reads this level through."""
    if choice not in MAPS:
        raise ValueError(f"unknown map {choice!r} (expected one of {', '.join(MAPS)})")
    return model.trained_map if choice == "trained" else choice


@torch.no_grad()
def masked_map(model: LevelObjective, inputs: torch.Tensor, masks: int = MASKS) -> torch.Tensor:
    """Each patch predicted while hidden, averaged over `ecgpos score`'s fixed masks: (B, L, N, D)."""
    return model.reconstruct_masked(inputs, masks)


def model_view(model: LevelObjective, choice: str = "trained") -> LevelView:
    """The view of a level objective through its map, in its patches' units (module docstring, 1)."""
    kind = map_kind(model, choice)
    return LevelView(
        model.level_inputs,
        model.patches,
        model.with_patches,
        model.patches,
        lambda inputs: model.in_patch_units(inputs, model.reconstruct_through(inputs, kind, MASKS)),
        model.norm_target,
    )


def scaled_perturbation(
    view: LevelView, inputs: torch.Tensor, e: torch.Tensor, delta: float, clean: torch.Tensor | None = None
) -> torch.Tensor:
    """The perturbed inputs x~ = x + s e, s per window so that d(x~, x) = delta in the target space.
    The target is linear in the patches (a level is read in its patches' units), so the size measured at
    a first guess (delta / |e|) fixes s; measured at about delta, it keeps float32's relative precision.
    `clean`: the inputs' target when already computed."""
    patches = view.patches(inputs)
    clean = view.target(inputs) if clean is None else clean
    shape = (-1, *[1] * (e.dim() - 1))
    guess = delta / per_sample_distance(e, torch.zeros_like(e)).clamp_min(1e-12)
    size = per_sample_distance(view.target(view.with_patches(inputs, patches + guess.reshape(shape) * e)), clean)
    return view.with_patches(inputs, patches + (guess * delta / size.clamp_min(1e-30)).reshape(shape) * e)


@torch.no_grad()
def window_readings(
    view: LevelView,
    inputs: torch.Tensor,
    e: torch.Tensor,
    delta: float,
    alpha: float = 1.0,
    clean: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(violated (B,) bool, pass-through rho (B,), perturbation size d(x~, x) (B,)) for inputs perturbed
    along directions e (B, L, N, D) at the calibrated size `delta`; `clean`: (target, map) of the inputs
    when already computed."""
    clean_t, clean_p = clean if clean is not None else (view.target(inputs), view.map(inputs))
    tilde = scaled_perturbation(view, inputs, e, delta, clean_t)
    tilde_t, tilde_p = view.target(tilde), view.map(tilde)
    size = per_sample_distance(tilde_t, clean_t)
    violated = alpha * size > per_sample_distance(tilde_p, tilde_t)
    rho = per_sample_distance(tilde_p, clean_p) / size
    return violated, rho, size


@dataclass
class FamilyReading:
    """One family's answer on a set of records: per record the violated fraction and the mean rho."""

    violation: dict[str, float] = field(default_factory=dict)
    pass_through: dict[str, float] = field(default_factory=dict)
    size_over_error: float = float("nan")  # median d(x~, x) / eps: the calibration actually reached


@dataclass
class CalibratedReading:
    map: str
    clean_error: float  # eps: median per-window d(P(x), x)
    kappa: float
    deciding: str
    families: dict[str, FamilyReading]


def clean_errors(
    view: LevelView, batches: Batches, moments: TokenMoments | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(d(P(x), x), |x|) of every window of `batches`, in order; the patches' moments into `moments`."""
    errors, norms = [], []
    with torch.no_grad():
        for _, x in batches():
            inputs = view.inputs(x)
            target = view.target(inputs)
            errors.append(per_sample_distance(view.map(inputs), target).cpu().numpy())
            norms.append(per_sample_distance(target, torch.zeros_like(target)).cpu().numpy())
            if moments is not None:
                moments.add(view.patches(inputs))
    if not errors:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(errors), np.concatenate(norms)


def calibrated_reading(
    view: LevelView,
    batches: Batches,
    families: Sequence[str],
    deciding: str,
    map_name: str = "",
    kappa: float = KAPPA,
    seed: int = CRITERION_SEED,
    directions: Callable[..., torch.Tensor] = direction,
) -> CalibratedReading:
    """The calibrated criterion of each family over `batches` (a callable: the records are read twice,
    once for eps and the principal directions, once perturbed). Each window's direction comes from a
    generator seeded by (seed, family, record id, window number): batching changes nothing."""
    moments = TokenMoments(view.centred)
    errors, norms = clean_errors(view, batches, moments)
    if errors.size == 0:
        return CalibratedReading(map_name, float("nan"), kappa, deciding, {f: FamilyReading() for f in families})
    eps = float(np.median(errors))
    # a level that reconstructs (almost) exactly is perturbed at a small fraction of its targets' size
    used = max(eps, EPS_FLOOR * float(np.median(norms)))
    basis = moments.principal()
    delta = kappa * used
    hits: dict[str, dict[str, list[tuple[float, float]]]] = {f: {} for f in families}
    sizes: dict[str, list[float]] = {f: [] for f in families}
    with torch.no_grad():
        for names, x in batches():
            inputs = view.inputs(x)
            patches = view.patches(inputs)
            clean = (view.target(inputs), view.map(inputs))
            for family in families:
                e = torch.cat(
                    [
                        directions(family, patches[i : i + 1], window_generator(seed, f"{family}\x00{r}", k), basis)
                        for i, (r, k) in enumerate(names)
                    ]
                )
                violated, rho, size = window_readings(view, inputs, e, delta, clean=clean)
                sizes[family] += size.tolist()
                for (record, _), v, p in zip(names, violated.tolist(), rho.tolist()):
                    hits[family].setdefault(record, []).append((float(v), float(p)))
    out = {
        f: FamilyReading(
            {r: float(np.mean([v for v, _ in h])) for r, h in hits[f].items()},
            {r: float(np.mean([p for _, p in h])) for r, h in hits[f].items()},
            # to the float32 distances' precision, so that a calibration of exactly kappa reads kappa
            round(float(np.median(sizes[f])) / used, 5) if sizes[f] and used > 0 else float("nan"),
        )
        for f in families
    }
    return CalibratedReading(map_name, eps, kappa, deciding, out)


def level_reading(
    model: LevelObjective, batches: Batches, choice: str = "trained", seed: int = CRITERION_SEED
) -> CalibratedReading:
    """The calibrated reading of a level objective on `batches`, every family of the level measured."""
    return calibrated_reading(
        model_view(model, choice),
        batches,
        level_families(model),
        deciding_family(model),
        map_kind(model, choice),
        seed=seed,
    )
