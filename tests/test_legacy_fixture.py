"""Runs and exports written by the two-level format still load, verify, embed, probe and serve as a base.

tests/fixtures/legacy_two_level holds two tiny runs (level 0, level 1 on it) and the level-1 export
with both decoders, written by ecgpos before levels became a list (make_fixture.sh says how): arch
{"kind": "nested", "stage0", "stage1"}, weights "stage0.*" / "stage1.*", run_info "stage0_encoder".
Their metrics.jsonl are the reference losses a run of today's code with the same seed must repeat.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ecgpos.cli import main
from ecgpos.export.decoders import load_decoders
from ecgpos.export.format import weights_hash
from ecgpos.export.load import load_encoder, read_export_config
from ecgpos.inference.resolve import resolve_encoder
from ecgpos.models.factory import depth_of
from ecgpos.models.nested import NestedEncoder

FIXTURE = Path(__file__).parent / "fixtures" / "legacy_two_level"
# The overrides make_fixture.sh trained both runs with.
SETS = [
    *("--set", "encoder.width=32", "--set", "encoder.heads=4", "--set", "encoder.depth=1"),
    *("--set", "decoder.width=16", "--set", "decoder.heads=2", "--set", "optim.steps=6"),
    *("--set", "optim.warmup_steps=2", "--set", "train.batch_size=4", "--set", "train.num_workers=0"),
    *("--set", "train.checkpoint_every=6", "--set", "train.log_every=1", "--set", "train.figure_every=100"),
]


def losses(run: Path) -> list[tuple[int, float, float | None]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["step"], r["loss"], r.get("recon_loss")) for r in rows if "loss" in r]


@pytest.fixture(scope="module")
def fixture_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shards the fixture's runs were trained on (make_fixture.sh: the same call, deterministic)."""
    from shard_fixtures import write_tiny_shards

    return write_tiny_shards(tmp_path_factory.mktemp("legacy") / "shards", n_records=24, records_per_shard=12)


def test_fixture_is_the_two_level_format() -> None:
    config = read_export_config(FIXTURE / "export1")
    assert set(config["arch"]) == {"kind", "stage0", "stage1"}
    assert "stage0_encoder" in json.loads((FIXTURE / "run1" / "run_info.json").read_text())


def test_legacy_runs_and_export_load_alike() -> None:
    """The level-1 run and its export give the same features; level 0 of both is the level-0 run."""
    run0, run1 = resolve_encoder(FIXTURE / "run0"), resolve_encoder(FIXTURE / "run1")
    exported = load_encoder(FIXTURE / "export1")
    assert isinstance(run1.module, NestedEncoder) and run1.module.depth == 2
    assert run1.arch["kind"] == "nested" and len(run1.arch["levels"]) == 2
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(run1.module.forward_features(x), exported.forward_features(x))
        assert torch.equal(run0.module.forward_features(x), exported.cut(0).forward_features(x))
        assert torch.equal(run0.module.forward_features(x), run1.module.forward_features(x, level=0))
    assert weights_hash(run1.module.levels[0]) == weights_hash(run0.module)
    assert resolve_encoder(FIXTURE / "export1", level=0).arch["kind"] == "level0"


def test_legacy_export_verifies_and_its_decoders_load(capsys: pytest.CaptureFixture) -> None:
    assert main(["verify", str(FIXTURE / "export1")]) == 0
    assert "FAIL" not in capsys.readouterr().out
    models = load_decoders(FIXTURE / "export1", read_export_config(FIXTURE / "export1"))
    assert list(models) == ["level0", "level1"]
    assert weights_hash(models["level1"].base) == weights_hash(load_encoder(FIXTURE / "export1").encoder.levels[0])


def test_legacy_export_embeds_at_each_level(real_record: Path, tmp_path: Path) -> None:
    feats = {}
    for level in ("0", "1", None):
        out = tmp_path / f"feats{level}.npz"
        args = ["embed", "--encoder", str(FIXTURE / "export1"), "--input", str(real_record), "--out", str(out)]
        assert main([*args, *(("--level", level) if level else ())]) == 0
        feats[level] = np.load(out)["features"]
    assert feats["0"].shape == feats["1"].shape == (1, 32) and not np.allclose(feats["0"], feats["1"])
    np.testing.assert_array_equal(feats["1"], feats[None])
    assert (
        main(
            [
                "embed",
                "--encoder",
                str(FIXTURE / "export1"),
                "--input",
                str(real_record),
                "--out",
                str(tmp_path / "f.npz"),
                "--level",
                "2",
            ]
        )
        == 2
    )


def test_legacy_runs_load_as_probe_encoders() -> None:
    from ecgpos.probes.shared.encoder import load_probe_encoder, random_twin

    for path, level, depth in ((FIXTURE / "run1", None, 2), (FIXTURE / "export1", 0, 1), (FIXTURE / "run0", None, 1)):
        enc = load_probe_encoder(str(path), level)
        assert depth_of(random_twin(enc).module) == depth
        assert enc.label.endswith("level 0") == (level == 0)


@pytest.mark.slow
def test_new_code_repeats_the_legacy_losses_and_builds_on_legacy_bases(fixture_shards: Path, tmp_path: Path) -> None:
    """Level 0, and level 1 on the fixture's level 0, trained by today's code with the fixture's seed and
    settings log the fixture's losses step for step; the legacy level-1 run and export serve as the
    base of a level 2."""
    common = ["--shards", str(fixture_shards), *SETS]
    assert (
        main(["pretrain", "--level", "0", "--config", "tiny/level0", "--run-dir", str(tmp_path / "r0"), *common]) == 0
    )
    level1 = ["pretrain", "--level", "1", "--config", "tiny/level1", "--base", str(FIXTURE / "run0")]
    assert main([*level1, "--run-dir", str(tmp_path / "r1"), *common]) == 0
    for new, old in (("r0", "run0"), ("r1", "run1")):
        got, want = losses(tmp_path / new), losses(FIXTURE / old)
        assert [g[0] for g in got] == [w[0] for w in want] == list(range(1, 7))
        np.testing.assert_allclose([g[1] for g in got], [w[1] for w in want], rtol=1e-5, atol=1e-6)
        if want[0][2] is not None:
            np.testing.assert_allclose([g[2] for g in got], [w[2] for w in want], rtol=1e-5, atol=1e-6)
    for base in ("run1", "export1"):
        run2 = tmp_path / f"r2-{base}"
        two = ["pretrain", "--level", "2", "--config", "tiny/level1", "--base", str(FIXTURE / base)]
        assert main([*two, "--run-dir", str(run2), *common, "--set", "optim.steps=2"]) == 0
        info = json.loads((run2 / "run_info.json").read_text())
        assert [entry["level"] for entry in info["chain"]] == [0, 1]
        assert info["chain"][0]["weights_sha256"] == weights_hash(resolve_encoder(FIXTURE / "run0").module)
        assert resolve_encoder(run2).module.depth == 3
