"""`ecgpos finetune`'s parts: augmentations, LoRA merging, layer-wise lr decay, what each mode trains, its config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from ecgpos.config import load_config
from ecgpos.errors import EcgposError
from ecgpos.models.factory import build_nested
from ecgpos.probes.finetune.augment import augment, lead_dropout, random_crop, time_shift
from ecgpos.probes.finetune.config import (
    AugmentConfig,
    FinetuneConfig,
    Mode,
    OptimConfig,
    check_finetune_config,
    parse_mode,
)
from ecgpos.probes.finetune.lora import LoRALinear, merge_lora
from ecgpos.probes.finetune.model import Classifier, blocks, layer_ids, param_groups, prepare_mode
from ecgpos.resources import config_path

TINY = {"width": 32, "depth": 2, "heads": 2, "mlp_ratio": 2.0}


def _classifier(classes: int = 3) -> Classifier:
    torch.manual_seed(0)
    return Classifier(build_nested([TINY, TINY]), classes)


def _trainable(model: Classifier) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def test_augmentations_are_pure_seeded_and_keep_shapes() -> None:
    x = torch.randn(4, 12, 2250)
    before = x.clone()
    a = augment(x, AugmentConfig(), 250.0, torch.Generator().manual_seed(1))
    b = augment(x, AugmentConfig(), 250.0, torch.Generator().manual_seed(1))
    assert torch.equal(x, before) and a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, x)
    off = AugmentConfig(p_shift=0, p_scale=0, p_wander=0, p_noise=0, p_dropout=0)
    assert torch.equal(augment(x, off, 250.0, torch.Generator().manual_seed(1)), x)


def test_time_shift_rolls_and_lead_dropout_zeroes_whole_leads() -> None:
    x = torch.arange(2 * 12 * 100, dtype=torch.float32).reshape(2, 12, 100)
    shifted = time_shift(x, 1.0, 0.2, torch.Generator().manual_seed(0))
    for i in range(2):  # every record is a rotation of itself, by one offset on all leads
        offset = next(o for o in range(100) if torch.equal(torch.roll(x[i, 0], o), shifted[i, 0]))
        assert torch.equal(torch.roll(x[i], offset, dims=-1), shifted[i]) and (offset <= 20 or offset >= 80)
    dropped = lead_dropout(x + 1, 1.0, 0.5, torch.Generator().manual_seed(3))
    zero = (dropped == 0).all(dim=-1)
    assert zero.any() and ((dropped != 0).all(dim=-1) | zero).all()


def test_random_crop_pads_short_records_and_stays_inside_long_ones() -> None:
    rng = np.random.default_rng(0)
    short = np.ones((12, 1000), np.float32)
    crop = random_crop(short, 2250, rng)
    assert crop.shape == (12, 2250) and crop[:, :1000].all() and not crop[:, 1000:].any()
    long = np.arange(5000, dtype=np.float32)[None].repeat(12, 0)
    crop = random_crop(long, 2250, rng)
    assert crop.shape == (12, 2250) and np.all(np.diff(crop[0]) == 1)


def test_lora_merged_model_gives_the_unmerged_outputs_with_the_encoder_keys() -> None:
    model = _classifier()
    keys = set(model.state_dict())
    prepare_mode(model, Mode("lora", 4), OptimConfig(drop_path=0.0))
    assert _trainable(model) == {n for n in _trainable(model) if "lora_" in n or n.startswith("head.")}
    for module in model.modules():  # as after training: adapters that change the output
        if isinstance(module, LoRALinear):
            torch.nn.init.normal_(module.lora_b, std=0.05)
    model.eval()
    x = torch.randn(2, 12, 2250)
    with torch.no_grad():
        unmerged = model(x)
        merge_lora(blocks(model.encoder))
        merged = model(x)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    assert set(model.state_dict()) == keys
    torch.testing.assert_close(merged, unmerged, rtol=1e-5, atol=1e-5)


def test_layer_decay_counts_blocks_across_levels_from_the_input() -> None:
    model = _classifier()
    ids = layer_ids(model)
    assert ids["encoder.levels.0.patch_embed.1.weight"] == 0
    assert ids["encoder.levels.0.blocks.0.attn.qkv.weight"] == 1
    assert ids["encoder.levels.0.blocks.1.mlp.fc2.weight"] == 2
    assert ids["encoder.levels.0.norm.weight"] == 2 and ids["encoder.levels.1.token_embed.1.weight"] == 2
    assert ids["encoder.levels.1.blocks.1.attn.proj.weight"] == 4
    assert ids["encoder.levels.1.norm.weight"] == ids["head.weight"] == 5
    optim = OptimConfig(layer_decay=0.5)
    groups = param_groups(model, optim)
    scale = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    decay = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert scale[id(named["head.weight"])] == 1.0
    assert scale[id(named["encoder.levels.0.patch_embed.1.weight"])] == 0.5**5
    assert scale[id(named["encoder.levels.1.blocks.0.attn.qkv.weight"])] == 0.5**2
    assert decay[id(named["encoder.levels.1.blocks.0.attn.qkv.weight"])] == optim.weight_decay
    assert decay[id(named["encoder.levels.1.blocks.0.attn.qkv.bias"])] == 0.0
    assert decay[id(named["encoder.levels.0.norm.weight"])] == decay[id(named["encoder.levels.0.lead_embed"])] == 0.0
    assert sum(len(g["params"]) for g in groups) == len(named)


@pytest.mark.parametrize(
    ("k", "lowest"),
    [
        (0, None),
        (1, "encoder.levels.1.blocks.1."),
        (2, "encoder.levels.1.blocks.0."),
        (3, "encoder.levels.0.blocks.1."),
    ],
)
def test_top_k_trains_the_top_blocks_across_levels_and_what_lies_above(k: int, lowest: str | None) -> None:
    model = _classifier()
    prepare_mode(model, Mode("top", k), OptimConfig())
    trains = _trainable(model)
    if lowest is None:
        assert trains == {"head.weight", "head.bias"}
        return
    assert lowest + "attn.qkv.weight" in trains and "encoder.levels.1.norm.weight" in trains
    below = {n for n in dict(model.named_parameters()) if layer_ids(model)[n] <= 4 - k}
    assert not trains & below
    assert ("encoder.levels.1.token_embed.1.weight" in trains) == (k == 3)


def test_full_mode_trains_everything_with_drop_path_rising_to_the_top() -> None:
    model = _classifier()
    prepare_mode(model, Mode("full"), OptimConfig(drop_path=0.3))
    assert _trainable(model) == set(dict(model.named_parameters()))
    rates = [getattr(b.drop_path1, "drop_prob", 0.0) for b in blocks(model.encoder)]
    assert rates[0] == 0.0 and rates[-1] == pytest.approx(0.3) and rates == sorted(rates)


def test_modes_parse_and_bad_ones_are_one_line() -> None:
    assert parse_mode("top:2").protocol == "finetune-top:2" and parse_mode("lora:8") == Mode("lora", 8)
    assert parse_mode("full").protocol == "finetune-full" and parse_mode("lp-ft").protocol == "finetune-lp-ft"
    for bad in ("lora:0", "top", "top:-1", "partial", "lora:x"):
        with pytest.raises(EcgposError, match="--mode must be"):
            parse_mode(bad)


def test_shipped_config_is_the_dataclass_defaults_and_bad_values_are_refused() -> None:
    shipped = load_config(FinetuneConfig, config_path("finetune"))
    assert shipped == FinetuneConfig()
    assert shipped.tune.lr == pytest.approx(1e-3 * 64 / 256)
    check_finetune_config(shipped)
    for bad in (
        dataclasses.replace(shipped, tune=dataclasses.replace(shipped.tune, layer_decay=0.0)),
        dataclasses.replace(shipped, augment=dataclasses.replace(shipped.augment, p_noise=1.5)),
        dataclasses.replace(shipped, fractions=(0.0,)),
    ):
        with pytest.raises(EcgposError):
            check_finetune_config(bad)


def test_results_without_a_protocol_column_read_as_linear_probes(tmp_path) -> None:
    from ecgpos.probes.shared.results import RESULT_COLUMNS, read_results, write_results

    row = {c: 0 for c in RESULT_COLUMNS} | {"encoder": "e", "task": "t", "note": "", "test_auroc": 0.7}
    del row["protocol"]  # what `ecgpos probe` rows hold: no protocol of their own
    frame = write_results([row], tmp_path)
    assert list(frame["protocol"]) == ["linear"]
    (tmp_path / "results.csv").write_text("encoder,task,fraction,seed,test_auroc\ne,t,1.0,0,0.7\n")  # an older file
    assert list(read_results(tmp_path)["protocol"]) == ["linear"]


def test_top_k_above_the_block_count_is_refused_before_training(capsys, shared_data, tmp_path) -> None:
    """A tiny nested encoder (2 + 2 blocks): top:99 would train what `full` trains under another name."""
    from refusal_helpers import one_line_error, run

    from ecgpos.resources import config_dir

    encoder = f"random:{config_dir() / 'tiny' / 'level1.yaml'}"
    data = ["--task", "ptbxl-super", "--data-root", shared_data, "--splits", shared_data / "merl_splits"]
    out = tmp_path / "out"
    rc, _, err = run(capsys, "finetune", "--encoder", encoder, "--mode", "top:99", *data, "--seeds", "1", "--out", out)
    line = one_line_error(rc, err, "finetune", "--mode top:99: the encoder has")
    total = int(line.split("the encoder has ")[1].split()[0])
    assert f"give K in 0..{total}" in line and not out.exists()


def test_a_warm_up_longer_than_the_run_is_said_capped_with_no_cosine_phase() -> None:
    from ecgpos.ecg.spec import PreprocessSpec
    from ecgpos.probes.finetune.report import protocol_markdown

    def text(epochs: int) -> str:
        cfg = dataclasses.replace(FinetuneConfig(), tune=dataclasses.replace(OptimConfig(), epochs=epochs))
        return protocol_markdown(cfg, Mode("full"), ["ptbxl-super"], PreprocessSpec())

    assert (
        "linear warm-up throughout all 2 epochs (tune.warmup_epochs 3 capped at the run's 2), no cosine phase"
        in text(2)
    )
    assert "linear warm-up throughout all 3 epochs, no cosine phase" in text(3)
    assert "3 warm-up epochs of 10 then cosine to 0" in text(10) and "no cosine" not in text(10)


def test_fine_tuning_schedule_is_pretraining_warm_up_and_cosine() -> None:
    from ecgpos.errors import ConfigError
    from ecgpos.pretrain.api import LRSchedule

    schedule = LRSchedule(lr=1e-3, warmup_steps=4, min_lr=1e-5, steps=12)
    assert [schedule.at(step) for step in range(4)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert schedule.at(8) == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)  # half-way through the cosine
    assert schedule.at(12) == schedule.at(40) == pytest.approx(1e-5)
    with pytest.raises(ConfigError, match="min_lr"):
        LRSchedule(lr=1e-3, warmup_steps=0, min_lr=1e-2, steps=10)


@pytest.mark.slow
def test_finetune_out_refuses_what_it_did_not_write_and_names_the_models_it_kept(capsys, shared_data, tmp_path) -> None:
    import json
    import shutil

    from refusal_helpers import one_line_error, run

    from ecgpos.resources import config_dir

    encoder = f"random:{config_dir() / 'tiny' / 'level0.yaml'}"
    args = ["finetune", "--encoder", encoder, "--task", "ptbxl-super", "--data-root", shared_data]
    args += ["--splits", shared_data / "merl_splits", "--mode", "top:0", "--fractions", "100", "--seeds", "1"]
    args += ["--epochs", "1", "--bootstrap", "0", "--cache-dir", tmp_path / "cache"]
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "todo.txt").write_text("mine\n")
    one_line_error(*run(capsys, *args, "--out", foreign)[::2], "finetune", "does not write (todo.txt)")
    assert sorted(p.name for p in foreign.iterdir()) == ["todo.txt"]

    out = tmp_path / "out"
    rc, _, err = run(capsys, *args, "--out", out)
    assert rc == 0, err
    probe = tmp_path / "probe"  # a linear probe's folder: its probe.json records no fine-tuning mode
    shutil.copytree(out, probe)
    info = json.loads((probe / "probe.json").read_text())
    (probe / "probe.json").write_text(json.dumps({k: v for k, v in info.items() if k != "mode"}))
    shutil.rmtree(probe / "models")
    (probe / "config.yaml").unlink()
    one_line_error(*run(capsys, *args, "--out", probe)[::2], "finetune", "holds the results of `ecgpos probe`")

    # a model of an earlier run at 50 % stays in models/ and is named, as is a feature cache inside --out
    shutil.copytree(out / "models" / "ptbxl-super" / "1", out / "models" / "ptbxl-super" / "0.5")
    shutil.copytree(tmp_path / "cache", out / "cache")
    rc, printed, err = run(capsys, *args, "--cache-dir", out / "cache", "--out", out)
    assert rc == 0, err
    assert f"ecgpos finetune: keeping {out / 'cache'} in --out" in err
    assert "kept 1 model folder(s) of an earlier run" in printed and "models/ptbxl-super/0.5/seed0" in printed
    assert "models/ptbxl-super/0.5/seed0" in (out / "summary.md").read_text()
