"""The calibrated carving criterion: controls whose answers are known, and the level maps it reads."""

from __future__ import annotations

import pytest
import torch
from pretrain_helpers import TINY0, TINY1

from ecgpos.objectives.calibrated import (
    LevelView,
    calibrated_reading,
    level_reading,
    map_kind,
    masked_map,
    model_view,
)
from ecgpos.objectives.criterion import bootstrap_interval, criterion
from ecgpos.objectives.perturbations import GAUSSIAN, PRINCIPAL, direction
from ecgpos.runs.levels import build_model
from ecgpos.runs.run_config import load_run_config

torch.set_num_threads(1)
SHAPE = (1, 16, 64)  # one "lead", 16 patches of 64 values: 1024 dimensions, as wide as a level's windows


def _records(n: int = 24, seed: int = 0) -> list[tuple[list[tuple[str, int]], torch.Tensor]]:
    x = torch.randn(n, *SHAPE, generator=torch.Generator().manual_seed(seed))
    return [([(f"r{i // 2}", i % 2) for i in range(s, s + 6)], x[s : s + 6]) for s in range(0, n, 6)]


def _view(fn) -> LevelView:  # the target space is the input itself
    return LevelView(lambda x: x, lambda x: x, lambda x, p: p, lambda x: x, fn)


def _read(fn, directions=None):
    batches = _records()
    kwargs = {"directions": directions} if directions else {}
    got = calibrated_reading(_view(fn), lambda: batches, ["d"], "d", **kwargs)
    family = got.families["d"]
    return criterion(family.violation), criterion(family.pass_through), got


def _noise(family, patches, generator, basis):
    return torch.randn(patches.shape, generator=generator)


def test_identity_reads_one_and_a_constant_reads_zero() -> None:
    c, rho, _ = _read(lambda x: x, _noise)
    assert (c, rho) == (1.0, pytest.approx(1.0, abs=1e-6))
    c, rho, got = _read(lambda x: torch.zeros_like(x) + 0.5, _noise)
    assert (c, rho) == (0.0, 0.0)
    assert got.families["d"].size_over_error == pytest.approx(2.0, rel=1e-4)  # delta = kappa * eps, kappa 2


def _projection(k: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(1024, 1024, generator=torch.Generator().manual_seed(9)))
    return q[:, :k]


def test_a_projection_passes_what_lies_in_its_subspace_and_removes_the_rest() -> None:
    u = _projection(32)

    def project(x: torch.Tensor) -> torch.Tensor:
        return (x.reshape(len(x), -1) @ u @ u.T).reshape(x.shape)

    def inside(family, patches, generator, basis):
        return (u @ torch.randn(32, generator=generator)).reshape(patches.shape)

    def orthogonal(family, patches, generator, basis):
        v = torch.randn(1024, generator=generator)
        return (v - u @ (u.T @ v)).reshape(patches.shape)

    c, rho, _ = _read(project, inside)
    assert c == 1.0 and rho == pytest.approx(1.0, abs=1e-5)
    c, rho, _ = _read(project, orthogonal)
    assert c == 0.0 and rho == pytest.approx(0.0, abs=1e-5)


def test_identity_with_reconstruction_noise_still_reads_one_under_calibration() -> None:
    """A map that passes the perturbation through but reconstructs with an error of size eps: the fixed
    push-pull size (0.1 std per value) lies far below eps and reads 0; the calibrated one reads 1."""
    from ecgpos.objectives.push_pull import push_margin_violated

    def noisy(x: torch.Tensor) -> torch.Tensor:  # independent noise, a different draw for every input
        g = torch.Generator().manual_seed(int(x.abs().sum() * 1e4) % (2**31))
        return x + 0.5 * torch.randn(x.shape, generator=g)

    c, rho, got = _read(noisy, _noise)
    assert c == 1.0 and 0.9 < rho < 1.3
    assert got.clean_error == pytest.approx(0.5 * 32, rel=0.1)  # 0.5 per value over 1024 values
    # the literal reading of the same map: gaussian at scale 0.1, alpha 1
    x = torch.cat([b for _, b in _records()])
    tilde = x + 0.1 * x.flatten(0, -2).std(0) * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    assert not push_margin_violated(x, tilde, noisy(tilde), 1.0).any()


def test_a_gaussian_direction_carries_the_windows_own_spread() -> None:
    patches = torch.randn(1, 2, 3, 5) * torch.arange(1.0, 6.0)
    e = direction(GAUSSIAN, patches, torch.Generator().manual_seed(0), None)
    assert e.shape == patches.shape
    with pytest.raises(ValueError, match="principal directions"):
        direction(PRINCIPAL, patches, torch.Generator(), None)


def test_bootstrap_of_pass_through_brackets_its_mean() -> None:
    values = {f"r{i}": 0.1 * (i % 5) for i in range(20)}
    lo, hi = bootstrap_interval(values)
    assert lo < criterion(values) < hi


def _models() -> dict[int, torch.nn.Module]:
    torch.manual_seed(0)
    level0 = build_model(load_run_config(TINY0, [], level=0)).eval()
    level1 = build_model(load_run_config(TINY1, [], level=1), level0.encoder).eval()
    return {0: level0, 1: level1}


def test_a_level_is_read_through_the_map_it_trained() -> None:
    models = _models()
    assert map_kind(models[1]) == "masked"
    models[1].push_pull.enabled = True
    assert map_kind(models[1]) == "unmasked" and map_kind(models[1], "masked") == "masked"
    with pytest.raises(ValueError):
        map_kind(models[1], "other")
    # the masked map predicts each patch while hidden: with a single mask, hidden patches equal the
    # decoder's prediction under that mask and visible ones the mean of their (visible) predictions
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(2))
    m = models[0]
    one = masked_map(m, x.float(), masks=1)
    from ecgpos.models.masking import expand_masking, score_maskings

    ((pred, mask),) = m.masked_predictions(x, [expand_masking(score_maskings(12, 30, 0.75, 1)[0], 2, "cpu")])
    assert torch.allclose(one, pred)
    assert not torch.allclose(masked_map(m, x), m.reconstruct(x))


@pytest.mark.parametrize("level", [0, 1])
def test_a_level_reading_does_not_depend_on_its_batches(level: int) -> None:
    model = _models()[level]
    x = torch.randn(6, 12, 2250, generator=torch.Generator().manual_seed(3))
    names = [(f"r{i // 2}", i % 2) for i in range(6)]
    whole = level_reading(model, lambda: [(names, x)])
    order = [5, 2, 0, 4, 1, 3]
    split = level_reading(
        model, lambda: [([names[i] for i in order[:4]], x[order[:4]]), ([names[i] for i in order[4:]], x[order[4:]])]
    )
    assert whole.clean_error == pytest.approx(split.clean_error, rel=1e-5)
    for family, reading in whole.families.items():
        assert reading.violation == split.families[family].violation
        other = split.families[family].pass_through
        assert all(reading.pass_through[r] == pytest.approx(other[r], rel=1e-4) for r in other)
        # read in its patches' units, a level's perturbation lies at exactly kappa * eps, normalised
        # targets (level 0) included
        assert reading.size_over_error == pytest.approx(2.0, rel=1e-3)
    assert whole.deciding == list(whole.families)[0]
    view = model_view(model)
    assert view.map is not model.reconstruct


def test_a_normalised_level_is_read_in_its_patches_units_along_shape_directions() -> None:
    """Level 0 trains on per-patch normalised targets: the criterion reads it in the patches' own units
    (each prediction mapped back with its patch's mean and std), and the deciding family's directions
    are those of the patches without their means, the part such a level models."""
    from ecgpos.objectives.perturbations import TokenMoments, deciding_family

    model = _models()[0]
    assert model.norm_target and deciding_family(model) == PRINCIPAL
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(4))
    view = model_view(model, "unmasked")
    assert torch.equal(view.target(x), model.patches(x)) and view.centred
    pred = model.reconstruct(x)
    patches = model.patches(x)
    assert torch.allclose(
        view.map(x), pred * patches.std(-1, unbiased=False, keepdim=True) + patches.mean(-1, keepdim=True), atol=1e-4
    )
    moments = TokenMoments(centred=True)
    moments.add(patches + 5.0 * torch.randn(2, 12, 30, 1))  # each patch's own level varies most
    vectors, _ = moments.principal()
    assert vectors.sum(0).abs().max() < 1e-6  # no direction moves a patch's mean
    raw = TokenMoments()
    raw.add(patches + 5.0 * torch.randn(2, 12, 30, 1))
    assert raw.principal()[0][:, 0].abs().std() < 0.05  # uncentred, the leading one is the patch mean
