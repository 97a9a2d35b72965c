"""The declared interface of a level (ecgpos.objectives.level.LevelObjective): level 0 and a latent
level built on it both fill in every member with the documented shapes; the one cut of a nested
encoder; no attribute sniffing of a model in the package sources."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from pretrain_helpers import TINY0, TINY1

from ecgpos.errors import EcgposError
from ecgpos.export.load import ExportedEncoder
from ecgpos.inference.resolve import resolve_encoder
from ecgpos.models.factory import build_nested
from ecgpos.models.masking import expand_masking, score_maskings
from ecgpos.models.nested import NestedEncoder, cut_encoder
from ecgpos.models.st_mem import STMEMEncoder
from ecgpos.objectives import LatentMaskedAutoencoder, MaskedECGAutoencoder
from ecgpos.objectives.level import LevelObjective
from ecgpos.objectives.push_pull import PushPullConfig
from ecgpos.runs.levels import build_model
from ecgpos.runs.run_config import load_run_config

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
B = 2


@pytest.fixture(scope="module")
def levels() -> dict[int, LevelObjective]:
    torch.manual_seed(0)
    level0 = build_model(load_run_config(TINY0, [], level=0)).eval()
    level1 = build_model(load_run_config(TINY1, [], level=1), level0.encoder).eval()
    return {0: level0, 1: level1}


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(B, 12, 2250, generator=torch.Generator().manual_seed(1))


def test_both_objectives_declare_the_level_interface(levels: dict[int, LevelObjective]) -> None:
    level0, level1 = levels[0], levels[1]
    assert isinstance(level0, MaskedECGAutoencoder) and isinstance(level1, LatentMaskedAutoencoder)
    assert all(isinstance(m, LevelObjective) for m in (level0, level1))
    assert (level0.level, level1.level) == (0, 1)
    assert (level0.is_latent, level1.is_latent) == (False, True)
    assert level0.base is None and level1.base is level0.encoder
    assert all(isinstance(m.push_pull, PushPullConfig) for m in (level0, level1))
    assert isinstance(level0.norm_target, bool) and isinstance(level1.norm_target, bool)
    assert level0.nested_encoder() is level0.encoder
    nested = level1.nested_encoder()
    assert isinstance(nested, NestedEncoder) and list(nested.levels) == [level0.encoder, level1.encoder]
    with pytest.raises(TypeError):
        LevelObjective()  # abstract: a level states its inputs, patches and encoder


@pytest.mark.parametrize("level", [0, 1])
def test_every_member_runs_with_the_documented_shapes(
    levels: dict[int, LevelObjective], x: torch.Tensor, level: int
) -> None:
    model = levels[level]
    e = model.encoder
    leads, n, d, w = e.num_leads, e.num_patches, model.patch_dim, e.width
    assert d == (w if level else e.patch_size)
    with torch.no_grad():
        inputs = model.level_inputs(x)
        assert inputs.shape == ((B, leads * (n + 2), w) if level else (B, leads, 2250))
        patches = model.patches(inputs)
        assert patches.shape == (B, leads, n, d)
        assert torch.equal(model.with_patches(inputs, patches), inputs)
        moved = model.with_patches(inputs, patches + 1.0)
        assert torch.allclose(model.patches(moved), patches + 1.0)
        assert model.target(inputs).shape == (B, leads, n, d)
        noise = model.draw_noise(B, torch.Generator().manual_seed(2))
        latent, mask, ids_restore = model.forward_encoder(inputs, noise)
        kept = latent.shape[2] - 2
        assert latent.shape == (B, leads, kept + 2, w) and 0 < kept < n
        assert mask.shape == ids_restore.shape == (B, leads, n) and mask.dtype == torch.bool
        assert int(mask.sum()) == B * leads * (n - kept)
        pred = model.forward_decoder(latent, ids_restore)
        assert pred.shape == (B, leads, n, d)
        loss, target = model.forward_loss(inputs, pred, mask)
        assert loss.shape == () and torch.isfinite(loss) and torch.equal(target, model.target(inputs))
        out = model(x, noise=noise)
        assert torch.equal(out["loss"] if not out["log"] else out["log"]["recon_loss"], loss)
        assert torch.equal(out["pred"], pred) and torch.equal(out["mask"], mask)
        unmasked = model.reconstruct(inputs)
        assert unmasked.shape == (B, leads, n, d)
        assert torch.equal(model.reconstruct_through(inputs, "unmasked"), unmasked)
        masked = model.reconstruct_through(inputs, "masked", masks=2)
        assert masked.shape == (B, leads, n, d) and not torch.allclose(masked, unmasked)
        with pytest.raises(ValueError, match="unknown map"):
            model.reconstruct_through(inputs, "trained")
        perturbed = model.perturb_patches(inputs, torch.Generator().manual_seed(3))
        assert perturbed.shape == inputs.shape and not torch.equal(model.patches(perturbed), patches)
        if level:  # the SEP outputs of the level below go into the map unperturbed
            by_lead = perturbed.reshape(B, leads, n + 2, w)
            clean = inputs.reshape(B, leads, n + 2, w)
            assert torch.equal(by_lead[:, :, [0, -1]], clean[:, :, [0, -1]])
        maskings = [expand_masking(m, B, "cpu") for m in score_maskings(leads, n, model.mask_ratio, 3)]
        errors = model.masked_errors(x, maskings)
        assert errors.shape == (3, B) and bool((errors > 0).all())
    assert model.trained_map == "masked"


def test_the_cut_gives_the_features_of_the_full_encoders_lower_levels() -> None:
    torch.manual_seed(0)
    level = {"width": 32, "depth": 1, "heads": 4}
    nested = build_nested([level, level, level]).eval()
    x = torch.randn(B, 12, 2250, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for top in range(3):
            cut = cut_encoder(nested, top)
            assert isinstance(cut, STMEMEncoder if top == 0 else NestedEncoder)
            assert torch.equal(cut.forward_features(x), nested.forward_features(x, level=top))
            assert torch.equal(cut.forward_tokens(x), nested.forward_tokens(x, level=top))
            assert nested.cut(top).state_dict().keys() == cut.state_dict().keys()
    assert cut_encoder(nested, None) is nested and cut_encoder(nested, 2) is nested
    assert cut_encoder(nested.levels[0], 0) is nested.levels[0]
    with pytest.raises(Exception, match="levels 0..2"):
        cut_encoder(nested, 3)


def test_no_model_is_told_apart_by_its_attributes() -> None:
    sniff = re.compile(r"hasattr\(model\b|getattr\(model, \"(push_pull|norm_target|base|encoder|latent_tokens)\"")
    found = [
        f"{path.relative_to(ROOT)}:{i}"
        for folder in ("ecgpos", "probes")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if sniff.search(line)
    ]
    assert found == []


def test_every_source_loads_as_the_one_loaded_encoder_type(x: torch.Tensor) -> None:
    loaded = resolve_encoder(f"random:{TINY1}")
    assert isinstance(loaded, ExportedEncoder) and loaded.module is loaded.encoder
    assert loaded.info["random_init"] and loaded.arch["kind"] == "nested"
    assert loaded.cut(None) is loaded and loaded.cut(1) is loaded
    cut = resolve_encoder(f"random:{TINY1}", level=0)
    assert isinstance(cut, ExportedEncoder) and isinstance(cut.encoder, STMEMEncoder)
    assert cut.info["level"] == 0 and cut.info["levels_of_source"] == 2 and cut.arch["kind"] == "level0"
    with torch.no_grad():
        assert torch.equal(cut.forward_features(x), loaded.encoder.forward_features(x, level=0))
    with pytest.raises(EcgposError, match="levels 0..1"):
        loaded.cut(2)
