"""One word for depth: "level". What ecgpos writes says level (config key, run_info.json, export keys, score
columns, run folders), and what runs, exports, configs and command lines spell "stage" still reads alike.

The preprint's "Stage 0" and "Stage 1" are level 0 and level 1; the old spellings are read only at the few
places listed in ALIAS_SITES, which the hygiene check below keeps from growing unnoticed.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ecgpos.cli import main
from ecgpos.config import load_config, read_yaml
from ecgpos.demo.joins import join_aurocs
from ecgpos.errors import ConfigError
from ecgpos.export.decoders import load_decoders
from ecgpos.export.load import read_export_config
from ecgpos.models.factory import arch_levels, build_encoder, encoder_arch
from ecgpos.models.latent_encoder import LatentEncoder
from ecgpos.models.nested import level_name, parse_level_name
from ecgpos.resources import config_dir, config_path
from ecgpos.runs.run_config import RunConfig, config_differences, load_run_config

REPO = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "legacy_two_level"
# The overrides tests/fixtures/legacy_two_level/make_fixture.sh trained its runs with.
FIXTURE_SETS = [
    "encoder.width=32",
    "encoder.heads=4",
    "encoder.depth=1",
    "decoder.width=16",
    "decoder.heads=2",
    "optim.steps=6",
    "optim.warmup_steps=2",
    "train.batch_size=4",
    "train.num_workers=0",
    "train.checkpoint_every=6",
    "train.log_every=1",
    "train.figure_every=100",
]
# Where the code may still say "stage": the places that read the old spellings, and the preprint's own names.
ALIAS_SITES = {
    "ecgpos/resources.py": ("OTHER_CONFIG_NAME", "stage0/stage1 config", "stage([01])", "tiny/stage1"),
    "ecgpos/runs/run_config.py": ('{"stage": "level"}',),
    "ecgpos/models/nested.py": ("stage0.", "stage1.", "stage<l>", "stage2", "(?:level|stage)", '"stage"'),
    "ecgpos/models/factory.py": ("stage0", "stage1"),
    "ecgpos/objectives/latent_mae.py": ('"stage0.*"', '"stage0."'),
    "ecgpos/runs/run_folder.py": ('"stage0"', "stage0_encoder", "stage0_weights_sha256"),
    "ecgpos/pretrain/plan.py": ("--stage0", "stage0_weights_sha256", '"stage0"'),
    "ecgpos/cli/pretrain.py": ("--stage",),
    "ecgpos/cli/carve.py": ("level-prefix", '"stage"', "stage<l>"),
    "ecgpos/export/decoders.py": ("stage<l>",),
    "probes/shared/published.py": ("Stage 0", "Stage 1", '"stage0"'),
    "probes/shared/reference/paper.csv": ("Stage 0", "Stage 1"),
}
STAGE_WORD = re.compile(r"(?<![a-z])stage(?:[0-9]+|s)?(?![a-z])", re.IGNORECASE)  # stage0_steps too, not "staged"
PREPRINT_QUOTE = re.compile(r"(?:paper|preprint)'s Stage[ -][01]")  # "level 0 (the preprint's Stage 0)": anywhere


def test_a_config_that_says_stage_reads_as_level(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text("stage: 1\nencoder:\n  width: 64\n  heads: 4\n")
    new.write_text("level: 1\nencoder:\n  width: 64\n  heads: 4\n")
    assert load_run_config(old) == load_run_config(new) and load_run_config(old).level == 1
    assert load_run_config(old, ["stage=2"]).level == 2 == load_run_config(None, ["stage=2"]).level
    both = tmp_path / "both.yaml"
    both.write_text("stage: 1\nlevel: 1\n")
    with pytest.raises(ConfigError, match="gives both stage and level") as err:
        load_run_config(both)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="contradicts"):
        load_run_config(old, level=0)
    # the runs of the legacy fixture (config.yaml: `stage:`) match a new config of the same settings on resume
    for run, name in (("run0", "tiny/level0"), ("run1", "tiny/level1")):
        saved = load_config(RunConfig, FIXTURE / run / "config.yaml")
        assert "stage" in read_yaml(FIXTURE / run / "config.yaml")
        assert config_differences(saved, load_run_config(name, FIXTURE_SETS)) == []


def test_the_stage_config_names_are_the_level_files(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ecgpos.resources

    monkeypatch.setattr(ecgpos.resources, "_NOTED", set())
    for old, new in (("stage0", "level0"), ("stage1.yaml", "level1"), ("tiny/stage0", "tiny/level0")):
        assert config_path(old) == config_path(new)
        note = capsys.readouterr().err
        assert note.count("\n") == 1 and f"config {old} is " in note
        assert config_path(old) == config_path(new) and capsys.readouterr().err == ""  # said once per process
    assert config_path(config_dir() / "tiny" / "stage1.yaml") == config_dir() / "tiny" / "level1.yaml"
    assert not (config_dir() / "stage0.yaml").exists() and (config_dir() / "level0.yaml").is_file()
    with pytest.raises(ConfigError, match="neither a file nor a shipped config"):
        config_path("stage7")


def test_the_stage_command_line_resolves_as_the_level_one(capsys: pytest.CaptureFixture) -> None:
    printed = []
    for argv in (["--stage", "1", "--config", "tiny/stage1"], ["--level", "1", "--config", "tiny/level1"]):
        assert main(["pretrain", *argv, "--check-config"]) == 0
        printed.append(capsys.readouterr().out)
    assert printed[0] == printed[1] and printed[1].startswith("level: 1\n") and "stage" not in printed[1]
    help_text = subprocess.run(
        [sys.executable, "-m", "ecgpos", "pretrain", "--help"], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert "--level N" in help_text and "--stage" not in help_text


def test_the_old_names_of_levels_kinds_and_columns_read_alike(tmp_path: Path) -> None:
    assert [parse_level_name(n) for n in ("level0", "stage1", "level12", "stage", "levels", "x1")] == [
        0,
        1,
        12,
        None,
        None,
        None,
    ]
    assert level_name(3) == "level3"
    cfg = {"width": 64, "heads": 4, "depth": 1}
    old, new = build_encoder("stage1", cfg), build_encoder("latent", cfg)
    assert isinstance(old, LatentEncoder) and isinstance(new, LatentEncoder)
    level0 = build_encoder("level0", cfg)
    assert encoder_arch(level0)["kind"] == "level0"
    full = encoder_arch(level0)
    assert arch_levels({**full, "kind": "stage0"}) == arch_levels(full) == [full["encoder"]]
    # the demo's join table reads score columns of either spelling
    labels, joins = tmp_path / "labels.csv", tmp_path / "joins.csv"
    labels.write_text("record_id,label\n" + "".join(f"n{i},NORM\n" for i in range(4)))
    aurocs = []
    for prefix in ("stage", "level"):
        scores = tmp_path / f"{prefix}.csv"
        scores.write_text(
            f"record_id,{prefix}0_score,{prefix}1_score\n" + "".join(f"n{i},{i},{4 - i}\n" for i in range(4))
        )
        joins.write_text(f"record_id,{prefix}0_score,{prefix}1_score\nj0,9,0\nj1,8,1\n")
        aurocs.append(join_aurocs(scores, labels, joins, ["NORM"]))
    assert aurocs[0] == aurocs[1] and set(aurocs[1]) == {0, 1} and aurocs[1][0] == 1.0


def test_the_legacy_export_decodes_under_the_level_names() -> None:
    config = read_export_config(FIXTURE / "export1")
    assert {"stage0", "stage1"} <= set(config["decoders"]) and config["training"]["stage"] == 1
    models = load_decoders(FIXTURE / "export1", config)
    assert list(models) == ["level0", "level1"]
    x = torch.randn(1, 12, 2250, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(models["level1"](x)["loss"])


def test_nothing_written_says_stage(
    level1_run: Path, real_record: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A fresh run's config.yaml and run_info.json, its export with decoders (config.json, decoder keys,
    model card) and its score table say level, never stage."""
    from safetensors import safe_open

    run_text = (level1_run / "config.yaml").read_text() + (level1_run / "run_info.json").read_text()
    assert "level: 1" in run_text and '"level": 1' in run_text and not STAGE_WORD.search(run_text)
    out = tmp_path / "export"
    assert main(["export", "--run-dir", str(level1_run), "--out", str(out), "--with-decoders"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert set(config["decoders"]) >= {"level0", "level1"} and config["training"]["level"] == 1
    with safe_open(str(out / "decoders.safetensors"), "pt") as handle:
        keys = list(handle.keys())
    assert keys and all(k.startswith(("level0.", "level1.")) for k in keys)
    for name in ("config.json", "README.md"):
        assert not STAGE_WORD.search((out / name).read_text()), name
    scores = tmp_path / "scores.csv"
    assert main(["score", "--run", str(out), "--input", str(real_record), "--out", str(scores), "--no-progress"]) == 0
    with scores.open() as handle:
        assert next(csv.reader(handle)) == ["record_id", "level0_score", "level1_score"]
    capsys.readouterr()


def _stage_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if STAGE_WORD.search(line)]


def test_the_code_says_level_outside_the_alias_sites() -> None:
    """Outside ALIAS_SITES the code of ecgpos, probes and preprocessing never says stage; at an alias
    site every such line names one of that site's old spellings."""
    found = []
    for root in ("ecgpos", "probes", "preprocessing"):
        for path in sorted((REPO / root).rglob("*")):
            if not path.is_file() or path.suffix not in (".py", ".csv", ".yaml", ".md") or path.name == "README.md":
                continue
            rel = path.relative_to(REPO).as_posix()
            allowed = ALIAS_SITES.get(rel)
            for line in _stage_lines(path):
                if PREPRINT_QUOTE.search(line) and not STAGE_WORD.search(PREPRINT_QUOTE.sub("", line)):
                    continue
                if allowed is None or not any(token in line for token in allowed):
                    found.append(f"{rel}: {line.strip()}")
    assert found == []
    assert all((REPO / site).is_file() for site in ALIAS_SITES)
