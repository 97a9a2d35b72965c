"""YAML -> dataclass configs (ecgpos.config) and the run configs (ecgpos.runs.run_config, configs/*.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from ecgpos.config import apply_overrides, from_dict, load_config, save_config, to_dict
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError
from ecgpos.models.masking import num_kept
from ecgpos.pretrain.optim import compile_notice, resolve_compile
from ecgpos.pretrain.schedule import lr_at
from ecgpos.resources import config_dir
from ecgpos.runs.run_config import OPERATIONAL_KEYS, RunConfig, config_differences, flat_dict, load_run_config

CONFIG_DIR = config_dir()

SHIPPED = ["level0.yaml", "level1.yaml", "stmem12.yaml", "tiny/level0.yaml", "tiny/level1.yaml"]


@dataclass
class Inner:
    rate: float = 0.5
    names: tuple[str, ...] = ("a",)


@dataclass
class Outer:
    count: int = 1
    flag: bool = False
    inner: Inner = field(default_factory=Inner)


def test_from_dict_nested_types_and_unknown_keys() -> None:
    cfg = from_dict(Outer, {"count": 3.0, "inner": {"rate": "2e-3", "names": ["x", "y"]}})
    assert cfg == Outer(3, False, Inner(0.002, ("x", "y")))
    with pytest.raises(ConfigError, match=r"unknown config key\(s\): inner.speed"):
        from_dict(Outer, {"inner": {"speed": 1}})
    with pytest.raises(ConfigError, match="count: expected an integer"):
        from_dict(Outer, {"count": 1.5})
    with pytest.raises(ConfigError, match="flag: expected true/false"):
        from_dict(Outer, {"flag": "yes"})


def test_overrides_parse_yaml_values_and_reject_bad_syntax() -> None:
    data = apply_overrides({"inner": {"rate": 1}}, ["inner.rate=0.25", "count=7", "inner.names=[p, q]"])
    assert from_dict(Outer, data) == Outer(7, False, Inner(0.25, ("p", "q")))
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["count"])
    with pytest.raises(ConfigError, match="not a section"):
        apply_overrides({"count": 1}, ["count.x=2"])


@pytest.mark.parametrize(
    "module, argv, subject",
    [
        (
            "ecgpos.cli.pretrain",
            ["--level", "0", "--config", "c", "--shards", "s", "--run-dir", "r"],
            "override a config key, e.g. --set optim",
        ),
        (
            "ecgpos.probes.linear.args",
            ["--task", "ptbxl-super"],
            "override a ProbeConfig key, e.g. --set windows_cpsc2018",
        ),
        ("ecgpos.preprocessing.cli", ["ecg-arrhythmia", "--out", "o"], "override one spec key, e.g. --set lowpass_hz"),
    ],
)
def test_each_command_takes_repeated_set_options_with_its_own_help(module: str, argv: list[str], subject: str) -> None:
    """pretrain, probe and preprocess share one `--set KEY=VALUE` option; its help names each one's keys."""
    import importlib

    parser = importlib.import_module(module).build_parser()
    args = parser.parse_args([*argv, "--set", "a.b=1", "--set", "c=2"])
    assert args.overrides == ["a.b=1", "c=2"]
    help_text = " ".join(parser.format_help().split())
    assert f"--set KEY=VALUE {subject}" in help_text and "(repeatable)" in help_text


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load_and_round_trip(name: str, tmp_path: Path) -> None:
    cfg = load_run_config(CONFIG_DIR / name)
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(RunConfig, tmp_path / "config.yaml") == cfg
    assert isinstance(cfg.optim.betas, tuple) and cfg.preprocess.window == cfg.encoder.seq_len


def test_paper_values() -> None:
    s0 = load_run_config(CONFIG_DIR / "level0.yaml")
    e = s0.encoder
    assert (s0.level, e.width, e.depth, e.heads, e.patch_size) == (0, 768, 6, 12, 75)
    assert (s0.decoder.width, s0.decoder.depth, s0.decoder.heads) == (256, 4, 4)
    assert s0.mask_ratio == 0.75 and s0.norm_target
    o = s0.optim
    assert (o.lr, o.weight_decay, o.betas, o.grad_clip) == (3.75e-5, 0.05, (0.9, 0.95), 1.0)
    assert (o.steps, o.warmup_steps, o.min_lr) == (150_000, 15_000, 1e-6)
    assert s0.train.batch_size == 64 and s0.preprocess.window == 2250 and s0.preprocess.fs == 250
    s1 = load_run_config(CONFIG_DIR / "level1.yaml")
    assert s1.level == 1 and s1.optim == s0.optim and s1.train == s0.train
    assert (s1.encoder.width, s1.encoder.depth, s1.decoder.depth) == (768, 6, 4) and not s1.push_pull.enabled
    st12 = load_run_config(CONFIG_DIR / "stmem12.yaml")
    assert config_differences(s0, st12) == ["encoder.depth: 6 -> 12"]


def test_paper_preprocessing_masking_and_absolute_lr() -> None:
    """The appendix's preprocessing in every paper config (the shards the defaults write fit all three),
    Level 1 masked as level 0, 7 of 30 patches kept per lead, and lr 3.75e-5 used as the peak lr
    whatever the batch (configs/README.md: it is not rescaled by batch / 256)."""
    paper = [load_run_config(CONFIG_DIR / n) for n in ("level0.yaml", "level1.yaml", "stmem12.yaml")]
    for cfg in paper:
        p = cfg.preprocess
        assert (p.highpass_hz, p.lowpass_hz, p.fs, p.window, p.standardise) == (0.67, 40.0, 250, 2250, "lead")
        assert p == PreprocessSpec() and cfg.mask_ratio == 0.75
    s0, s1 = paper[0], paper[1]
    assert (s1.decoder.width, s1.decoder.heads, s1.encoder.heads) == (256, 4, 12) and not s1.norm_target
    assert num_kept(s0.encoder.num_patches, s0.mask_ratio) == 7
    for batch in (64, 256):
        optim = load_run_config(CONFIG_DIR / "level0.yaml", [f"train.batch_size={batch}"]).optim
        assert lr_at(14_999, optim) == pytest.approx(3.75e-5) and lr_at(150_000, optim) == pytest.approx(1e-6)


def test_tiny_configs_are_small_versions() -> None:
    t0, t1 = (load_run_config(CONFIG_DIR / "tiny" / n) for n in ("level0.yaml", "level1.yaml"))
    assert (t0.encoder.width, t0.encoder.depth, t0.decoder.depth) == (64, 2, 1) and 32 <= t0.decoder.width <= 64
    assert t1.level == 1 and t1.encoder.width == t0.encoder.width and t0.optim.steps == 200


@pytest.mark.parametrize(
    "override, message",
    [
        ("mask_ratio=1.0", "mask_ratio must lie in"),
        ("mask_ratio=0.0", "mask_ratio must lie in"),
        ("mask_ratio=0.99", "keeps 0 of 30"),
        ("level=-1", "level must be an integer >= 0"),
        ("encoder.patch_size=80", "not a multiple"),
        ("encoder.seq_len=1500", "must equal preprocess.window"),
        ("encoder.heads=5", "not divisible"),
        ("optim.lr=0", "optim.lr must be > 0"),
        ("optim.min_lr=1.0", "optim.min_lr must lie in"),
        ("optim.steps=0", "optim.steps must be >= 1"),
        ("optim.betas=[0.9, 1.0]", "optim.betas"),
        ("train.batch_size=10", "not a multiple of train.grad_accum"),
        ("train.val_fraction=1.0", "val_fraction"),
        ("train.mixed_precision=fp16", "must be one of"),
        ("push_pull.lambda_sp=0.1", "at level 0 it must be 0"),
        ("preprocess.standardise=global", "standardise"),
    ],
)
def test_impossible_values_are_one_line_config_errors(override: str, message: str) -> None:
    overrides = [override] + (["train.grad_accum=4"] if override.startswith("train.batch_size") else [])
    with pytest.raises(ConfigError, match=message) as err:
        load_run_config(CONFIG_DIR / "tiny" / "level0.yaml", overrides)
    assert "\n" not in str(err.value)


def test_level_flag_against_config(tmp_path: Path) -> None:
    assert load_run_config(CONFIG_DIR / "tiny" / "level1.yaml", level=1).level == 1
    with pytest.raises(ConfigError, match="contradicts"):
        load_run_config(CONFIG_DIR / "tiny" / "level0.yaml", level=1)
    (tmp_path / "c.yaml").write_text("encoder:\n  width: 64\n  heads: 4\n")
    assert load_run_config(tmp_path / "c.yaml", level=1).level == 1  # the file leaves the level open


def test_config_differences_ignore_operational_keys() -> None:
    a = load_run_config(CONFIG_DIR / "tiny" / "level0.yaml")
    b = load_run_config(
        CONFIG_DIR / "tiny" / "level0.yaml", ["train.num_workers=0", "train.log_every=1", "optim.lr=0.002"]
    )
    assert config_differences(a, b) == ["optim.lr: 0.001 -> 0.002"]
    assert set(OPERATIONAL_KEYS) <= set(flat_dict(a))
    assert to_dict(a)["optim"]["betas"] == [0.9, 0.95]


def test_start_line_warns_that_a_compiled_run_waits_for_its_compile(monkeypatch) -> None:
    """A cold compile holds the first step for minutes; the start line says so, and where the kernels go."""
    assert compile_notice(False) == ""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/work/compile-cache")
    notice = compile_notice("reduce-overhead")
    assert "compile reduce-overhead" in notice and "first step" in notice and "/work/compile-cache" in notice
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert "compile default" in compile_notice(True) and "Inductor's default" in compile_notice(True)


def test_train_compile_takes_a_bool_or_a_mode_and_is_operational() -> None:
    assert load_run_config("tiny/level0").train.compile == "auto"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_compile("auto", cpu) is False and resolve_compile("auto", cuda) == "reduce-overhead"
    assert resolve_compile("auto", cuda, num_processes=2) is False and resolve_compile(True, cpu) is True
    # CUDA graphs stop at the second micro-batch: auto compiles accumulation without them, explicit modes are refused
    assert resolve_compile("auto", cuda, grad_accum=2) is True and resolve_compile(True, cuda, grad_accum=2) is True
    assert resolve_compile("reduce-overhead", cpu, grad_accum=2) == "reduce-overhead"
    with pytest.raises(ConfigError, match="CUDA graphs.*grad_accum 2"):
        resolve_compile("reduce-overhead", cuda, grad_accum=2)
    assert load_run_config("tiny/level0", ["train.compile=true"]).train.compile is True
    assert load_run_config("tiny/level0", ["train.compile=off"]).train.compile is False  # YAML reads off as false
    for mode in ("default", "reduce-overhead", "max-autotune-no-cudagraphs"):
        assert load_run_config("tiny/level0", [f"train.compile={mode}"]).train.compile == mode
    with pytest.raises(ConfigError, match="train.compile.*reduce-overhead"):
        load_run_config("tiny/level0", ["train.compile=fast"])
    eager, compiled = load_run_config("tiny/level0"), load_run_config("tiny/level0", ["train.compile=true"])
    assert "train.compile" in OPERATIONAL_KEYS and config_differences(eager, compiled) == []
