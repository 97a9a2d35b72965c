"""Depth as a list of levels: an L-level encoder and its cuts agree, and a third level trains, resumes
bit-exactly after kill -9, exports, verifies, embeds and probes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from pretrain_helpers import max_diff, metrics, weights

from ecgpos.cli import main
from ecgpos.export.load import load_encoder
from ecgpos.inference.resolve import resolve_encoder
from ecgpos.models.factory import cut_encoder, encoder_arch, encoder_from_state, module_from_arch, weights_hash
from ecgpos.models.nested import NestedEncoder
from ecgpos.models.st_mem import STMEMEncoder
from ecgpos.objectives.criterion import window_violations

LEVEL = {"num_leads": 12, "seq_len": 2250, "patch_size": 75, "width": 32, "depth": 1, "heads": 4, "mlp_ratio": 2.0}
# Small and quick levels: width 32, one block, 24 records in batches of 4 (6 steps per epoch).
SETS = [
    *("--set", "encoder.width=32", "--set", "encoder.heads=4", "--set", "encoder.depth=1"),
    *("--set", "decoder.width=16", "--set", "decoder.heads=2", "--set", "optim.warmup_steps=2"),
    *("--set", "train.batch_size=4", "--set", "train.num_workers=0", "--set", "train.log_every=1"),
    *("--set", "train.figure_every=100"),
]


def start(*args: str) -> subprocess.Popen:
    """`ecgpos ARGS` in a process group of its own, as a terminal or Slurm runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "ecgpos.cli", *args]
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert path.exists(), proc.communicate()[1][-2000:]


def test_an_l_level_encoder_and_its_cuts_have_the_same_weights_and_outputs() -> None:
    torch.manual_seed(0)
    nested = module_from_arch({"kind": "nested", "levels": [LEVEL, {**LEVEL, "depth": 2}, LEVEL]}).eval()
    assert nested.depth == 3 and encoder_arch(nested)["levels"][1]["depth"] == 2
    x = torch.randn(2, 12, 2250, generator=torch.Generator().manual_seed(1))
    full = nested.state_dict()
    with torch.no_grad():
        for level in range(3):
            cut = cut_encoder(nested, level)
            assert isinstance(cut, STMEMEncoder if level == 0 else NestedEncoder)
            prefix = "levels.0." if level == 0 else ""
            own = {prefix + k: v for k, v in cut.state_dict().items()}
            assert set(own) == {k for k in full if int(k.split(".")[1]) <= level}
            assert all(torch.equal(v, full[k]) for k, v in own.items())
            rebuilt = encoder_from_state(encoder_arch(cut), cut.state_dict())
            for module in (cut, rebuilt):
                assert torch.equal(module.forward_features(x), nested.forward_features(x, level=level))
                assert torch.equal(module.forward_tokens(x), nested.forward_tokens(x, level=level))
        features = [nested.forward_features(x, level=level) for level in range(3)]
    assert not torch.allclose(features[1], features[2])
    with pytest.raises(Exception, match="levels 0..2"):
        cut_encoder(nested, 3)


@pytest.fixture(scope="module")
def depth_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shard_fixtures import write_tiny_shards

    return write_tiny_shards(tmp_path_factory.mktemp("depth") / "shards", n_records=24, records_per_shard=12)


def pretrain_level(level: int, shards: Path, run: Path, *extra: str, base: Path | None = None) -> list[str]:
    config = "tiny/level0" if level == 0 else "tiny/level1"
    args = ["pretrain", "--level", str(level), "--config", config, "--shards", str(shards), "--run-dir", str(run)]
    return [*args, *(("--base", str(base)) if base else ()), *SETS, *extra]


@pytest.mark.slow
def test_a_third_level_trains_resumes_after_kill_exports_embeds_and_probes(
    depth_shards: Path, shared_data: Path, tmp_path: Path
) -> None:
    steps = ("--set", "optim.steps=4")
    assert main(pretrain_level(0, depth_shards, tmp_path / "l0", *steps)) == 0
    assert main(pretrain_level(1, depth_shards, tmp_path / "l1", *steps, base=tmp_path / "l0")) == 0
    # a base of another depth is one line, exit 2
    assert main(pretrain_level(2, depth_shards, tmp_path / "bad", *steps, base=tmp_path / "l0")) == 2
    third = ("--set", "optim.steps=10", "--set", "train.checkpoint_every=5")
    straight, killed = tmp_path / "l2", tmp_path / "l2-killed"
    assert main(pretrain_level(2, depth_shards, straight, *third, base=tmp_path / "l1")) == 0
    proc = start(*pretrain_level(2, depth_shards, killed, *third, base=tmp_path / "l1"))
    wait_for(killed / "checkpoints" / "step-0000005", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert main(pretrain_level(2, depth_shards, killed, *third, "--resume", "auto", base=tmp_path / "l1")) == 0
    assert max_diff(weights(killed), weights(straight)) == 0.0
    assert [r["loss"] for r in metrics(killed)] == [r["loss"] for r in metrics(straight)]
    info = json.loads((straight / "run_info.json").read_text())
    assert [(e["level"], e["kind"]) for e in info["chain"]] == [(0, "run"), (1, "run")]
    assert info["chain"][0]["source"] == str((tmp_path / "l0").resolve())
    assert info["chain"][1]["weights_sha256"] == weights_hash(resolve_encoder(tmp_path / "l1").module.levels[1])

    export, cut = tmp_path / "export", tmp_path / "export-l1"
    assert main(["export", "--run-dir", str(straight), "--out", str(export), "--with-decoders"]) == 0
    assert main(["export", "--run-dir", str(straight), "--out", str(cut), "--level", "1"]) == 0
    assert main(["verify", str(export)]) == 0 and main(["verify", str(cut)]) == 0
    decoders = json.loads((export / "config.json").read_text())["decoders"]
    assert [k for k in decoders if k.startswith("level")] == ["level0", "level1", "level2"]
    whole, part = load_encoder(export), load_encoder(cut)
    assert whole.encoder.depth == 3 and part.encoder.depth == 2
    assert weights_hash(part.encoder) == weights_hash(whole.cut(1).encoder)
    card = (cut / "README.md").read_text()
    assert "nested encoder of 2 levels" in card and "Levels in this export: 0..1" in card

    record = shared_data / "ptbxl" / "records500"
    feats = {}
    for level in ("0", "1", "2"):
        out = tmp_path / f"f{level}.npz"
        assert (
            main(["embed", "--encoder", str(export), "--input", str(record), "--out", str(out), "--level", level]) == 0
        )
        feats[level] = np.load(out)["features"]
    assert len({f.shape for f in feats.values()}) == 1 and not np.allclose(feats["1"], feats["2"])

    probe = ["probe", "--encoder", str(straight), "--level", "1", "--task", "ptbxl-super", "--fractions", "100"]
    probe += ["--data-root", str(shared_data), "--splits", str(shared_data / "merl_splits"), "--seeds", "1"]
    probe += ["--epochs", "1", "--workers", "1", "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "p")]
    assert main(probe) == 0
    assert "level 1" in (tmp_path / "p" / "results.csv").read_text()


def test_push_pull_at_level_0_perturbs_the_signal_and_trains_the_encoder() -> None:
    """AE-PP: Level 0 with push-pull adds the push-pull term on perturbed signal patches."""
    from ecgpos.runs.levels import build_model
    from ecgpos.runs.run_config import load_run_config

    cfg = load_run_config("tiny/level0", ["push_pull.enabled=true", "push_pull.lambda_pp=0.5"])
    torch.manual_seed(0)
    model = build_model(cfg).train()
    x = torch.randn(3, 12, 2250, generator=torch.Generator().manual_seed(1))
    out = model(x, generator=torch.Generator().manual_seed(2))
    log = out["log"]
    assert set(log) == {"recon_loss", "pp_loss", "push_active"}
    assert torch.allclose(out["loss"], log["recon_loss"] + 0.5 * log["pp_loss"])
    out["loss"].backward()
    assert model.encoder.patch_embed[1].weight.grad.abs().sum() > 0
    tilde = model.perturb_patches(x, torch.Generator().manual_seed(3))
    assert tilde.shape == x.shape and not torch.equal(tilde, x)
    assert model.reconstruct(x).shape == (3, 12, 30, 75)
    violated = window_violations(model, x, [("r", k) for k in range(len(x))])  # AE-PP's criterion
    assert violated.shape == (3,) and violated.dtype == torch.bool


def test_the_leakage_guard_reads_the_pretraining_shards_of_every_level_below(tmp_path: Path) -> None:
    from ecgpos.probes.shared.leakage import recorded_pretraining

    runs = [tmp_path / f"l{level}" for level in range(3)]
    infos = [
        {"stage": 0, "shards": ["/data/a"]},
        {"stage": 1, "shards": ["/data/b"], "stage0": str(runs[0])},  # the two-level record of its base
        {
            "stage": 2,
            "shards": ["/data/c"],
            "base": str(runs[1]),
            "chain": [{"level": 0, "source": "/gone/l0", "shards": ["/data/a2"]}, {"level": 1, "source": str(runs[1])}],
        },
    ]
    for run, info in zip(runs, infos):
        run.mkdir()
        (run / "run_info.json").write_text(json.dumps(info))
    found = {str(p) for p in recorded_pretraining(str(runs[2]), {})}
    assert found == {"/data/a", "/data/a2", "/data/b", "/data/c"}


def test_the_random_baseline_of_a_latent_config_builds_each_level_at_its_own_size(tmp_path: Path) -> None:
    from ecgpos.inference.resolve import random_encoder
    from ecgpos.models.factory import levels_of

    tiny0 = (Path(__file__).parents[1] / "configs" / "tiny" / "level0.yaml").read_text()
    tiny1 = (Path(__file__).parents[1] / "configs" / "tiny" / "level1.yaml").read_text()
    (tmp_path / "level0.yaml").write_text(tiny0.replace("depth: 2", "depth: 3", 1))
    (tmp_path / "latent.yaml").write_text(tiny1.replace("depth: 2", "depth: 1", 1))
    loaded = random_encoder(tmp_path / "latent.yaml")
    assert [len(level.blocks) for level in levels_of(loaded.module)] == [3, 1]
    assert loaded.arch["levels"][0]["depth"] == 3
    (tmp_path / "level0.yaml").unlink()  # no level-0 config beside it: the latent section stands in
    assert [len(level.blocks) for level in levels_of(random_encoder(tmp_path / "latent.yaml").module)] == [1, 1]
