"""Every level compiles: a latent level (1, 2) trained under `train.compile` follows the eager run,
keeps the levels below it frozen, resumes across compiled and eager, exports; a step that cannot
compile is one line ("auto": trained eagerly and recorded; an explicit mode: refused before step 1).

Inductor compiles on the CPU here (its C++ back-end); the kernels land in Inductor's cache, shared by
the tests of a session, so each graph is compiled once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from classifier_fixtures import hub_cache
from pretrain_helpers import max_diff, metrics, pretrain, weights
from tiny_runs import cli

from ecgpos.inference.resolve import load_run_encoder
from ecgpos.runs.run_folder import newest_checkpoint

# fp32 on the CPU: Inductor reorders sums, so losses drift apart by float rounding, growing with the steps
LOSS_REL_TOLERANCE = 1e-3
STEPS = ["--set", "optim.steps=10", "--set", "train.checkpoint_every=5"]


@pytest.fixture(scope="module")
def chain(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Levels 0 and 1, eager, 6 steps each: the bases of the compiled levels 1 and 2."""
    root = tmp_path_factory.mktemp("compile-chain")
    few = ["--set", "optim.steps=6", "--set", "train.compile=false"]
    assert pretrain(0, shards, root / "level0", *few) == 0
    assert pretrain(1, shards, root / "level1", *few, "--base", str(root / "level0")) == 0
    return [root / "level0", root / "level1"]


def train_level(level: int, base: Path | str, shards: Path, run: Path, *extra: str) -> list[dict]:
    """`ecgpos pretrain --level LEVEL --base BASE` with STEPS (+ extra) -> its train records."""
    assert pretrain(level, shards, run, *STEPS, "--base", str(base), *extra) == 0
    return [r for r in metrics(run) if "loss" in r]


def assert_same_losses(eager: list[dict], compiled: list[dict]) -> None:
    assert [r["step"] for r in eager] == [r["step"] for r in compiled] == list(range(1, 11))
    for a, b in zip(eager, compiled):
        assert b["loss"] == pytest.approx(a["loss"], rel=LOSS_REL_TOLERANCE), (a, b)


@pytest.mark.parametrize(("level", "grad_accum"), [(1, 1), (1, 2), (2, 1), (2, 2)])
def test_a_compiled_latent_level_follows_the_eager_run(
    level: int, grad_accum: int, chain: list[Path], shards: Path, tmp_path: Path
) -> None:
    """Same seed, same losses over 10 steps; the frozen levels keep their weights bit for bit and get
    no optimizer state. Micro-batches of 8 either way, so both accumulations share one graph."""
    accum = ["--set", f"train.grad_accum={grad_accum}", "--set", f"train.batch_size={8 * grad_accum}"]
    base = chain[level - 1]
    eager = train_level(level, base, shards, tmp_path / "eager", *accum, "--set", "train.compile=false")
    compiled = train_level(level, base, shards, tmp_path / "compiled", *accum, "--set", "train.compile=true")
    assert_same_losses(eager, compiled)
    assert all(r["compiled"] for r in compiled) and not any(r["compiled"] for r in eager)
    info = json.loads((tmp_path / "compiled" / "run_info.json").read_text())
    assert (info["compile"], info["level"], info["finished"]) == ("default", level, True)
    assert "compile_fallback" not in info
    trained = weights(tmp_path / "compiled")
    below = load_run_encoder(base).module.state_dict()  # the frozen levels, as their own run holds them
    assert below and all(torch.equal(trained[f"base.{name}"], t) for name, t in below.items())
    own = [k for k in trained if not k.startswith("base.")]
    optimizer = torch.load(newest_checkpoint(tmp_path / "compiled") / "optimizer.bin", weights_only=False)
    assert len(optimizer["state"]) == len(own)  # moments for this level's tensors only


def test_carve_compiles_every_level(shards: Path, tmp_path: Path) -> None:
    """`ecgpos carve` with compiling on trains level 0 and level 1 compiled, to the end."""
    quick = ["--set", "optim.steps=4", "--set", "train.batch_size=8", "--set", "train.num_workers=0"]
    rc = cli(
        "carve", "--config", "tiny/level0", "--latent-config", "tiny/level1", "--shards", shards,
        "--run-dir", tmp_path, "--max-levels", 2, "--stop-below", 0, "--min-drop", -1,
        *quick, "--set", "train.compile=true",
    )  # fmt: skip
    assert rc == 0
    for level in (0, 1):
        info = json.loads((tmp_path / f"level{level}" / "run_info.json").read_text())
        assert info["finished"] and info["compile"] == "default", info
        assert all(r["compiled"] for r in metrics(tmp_path / f"level{level}") if "loss" in r)


@pytest.mark.parametrize("first", ["compiled", "eager"])
def test_a_checkpoint_resumes_across_compiled_and_eager(
    first: str, chain: list[Path], shards: Path, tmp_path: Path
) -> None:
    """Interrupted after the step-5 checkpoint, a level-1 run resumed the other way (eager after
    compiled, compiled after eager) logs the uninterrupted run's losses and ends at its weights."""
    modes = {"compiled": "train.compile=true", "eager": "train.compile=false"}
    then = "eager" if first == "compiled" else "compiled"
    straight = train_level(1, chain[0], shards, tmp_path / "straight", "--set", modes[first])
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "straight", crashed)
    shutil.rmtree(crashed / "checkpoints" / "step-0000010")
    resumed = train_level(1, chain[0], shards, crashed, "--set", modes[then], "--resume", "auto")
    assert_same_losses(straight, resumed)
    assert [r["compiled"] for r in resumed] == [first == "compiled"] * 5 + [then == "compiled"] * 5
    assert max_diff(weights(crashed), weights(tmp_path / "straight")) <= 1e-4
    if first == "compiled":  # a compiled run exports and verifies like any other
        assert cli("export", "--run-dir", tmp_path / "straight", "--out", tmp_path / "export") == 0
        assert cli("verify", tmp_path / "export") == 0


def test_a_compiled_level_trains_on_an_exported_and_a_hub_base(
    chain: list[Path], shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export of level 0, local or from the Hub cache (offline), is the same base as its run: the
    compiled level 1 on each logs the same losses."""
    import huggingface_hub

    assert cli("export", "--run-dir", chain[0], "--out", tmp_path / "export0") == 0
    hub_cache(tmp_path / "hub", "ecg-lab/level0", tmp_path / "export0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    on_run = train_level(1, chain[0], shards, tmp_path / "on-run", "--set", "train.compile=true")
    for name, base in (("on-export", tmp_path / "export0"), ("on-hub", "hf://ecg-lab/level0")):
        on_export = train_level(1, base, shards, tmp_path / name, "--set", "train.compile=true")
        assert [r["loss"] for r in on_export] == [r["loss"] for r in on_run], name


@pytest.fixture
def without_a_cxx_compiler():
    """Inductor's C++ back-end pointed at a compiler that does not exist: a real compile failure (as on
    a node without g++), not a simulated one. Its cache key includes the setting, so nothing cached hides it."""
    import torch._inductor.config as inductor

    torch._dynamo.reset()
    with inductor.patch({"cpp.cxx": (None, "ecgpos-test-no-such-cxx")}):
        yield
    torch._dynamo.reset()


@pytest.mark.usefixtures("without_a_cxx_compiler")
def test_an_explicit_mode_that_cannot_compile_stops_before_step_1(
    chain: list[Path], shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    assert pretrain(1, shards, run, *STEPS, "--base", str(chain[0]), "--set", "train.compile=true") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.compile=True cannot compile the training step" in err[0], err
    assert "InvalidCxxCompiler" in err[0] and "train.compile=false" in err[0]
    assert not (run / "config.yaml").exists() and not list(run.glob("checkpoints/*"))


def test_auto_that_cannot_compile_trains_eagerly_and_says_so(
    chain: list[Path],
    shards: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    request: pytest.FixtureRequest,
) -> None:
    """ "auto" compiles on one GPU; here it is made to compile on the CPU (the resolution is
    test_config's), with no C++ compiler: one warning line, an eager run that logs the eager
    run's losses exactly, and run_info.json and every metrics record saying it ran eager."""
    import ecgpos.pretrain.trainer as trainer

    eager = train_level(1, chain[0], shards, tmp_path / "eager", "--set", "train.compile=false")
    capsys.readouterr()
    monkeypatch.setattr(trainer, "resolve_compile", lambda mode, *args: True if mode == "auto" else mode)
    request.getfixturevalue("without_a_cxx_compiler")
    fallen = train_level(1, chain[0], shards, tmp_path / "auto", "--set", "train.compile=auto")
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "train.compile=auto could not compile the training step" in warnings[0]
    assert "InvalidCxxCompiler" in warnings[0] and warnings[0].endswith("training eagerly")
    assert [r["loss"] for r in fallen] == [r["loss"] for r in eager]
    assert not any(r["compiled"] for r in fallen)
    info = json.loads((tmp_path / "auto" / "run_info.json").read_text())
    assert info["compile"] == "eager" and "InvalidCxxCompiler" in info["compile_fallback"]
