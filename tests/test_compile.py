"""The compiled training step (train.compile): each objective draws its random numbers outside the
forward (`draw_noise`), so the forward it compiles is one graph with no breaks; a compiled CPU run
follows the eager run step for step, and its validation and figures run eagerly instead of
compiling graphs of their own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pretrain_helpers import metrics, pretrain
from torch._dynamo.utils import counters

from ecgpos.models.factory import build_nested
from ecgpos.runs.levels import build_model
from ecgpos.runs.run_config import load_run_config

PUSH_PULL = ["push_pull.enabled=true", "push_pull.lambda_sp=0.1"]
OBJECTIVES = {
    "level0": ("tiny/level0", []),
    "level1": ("tiny/level1", []),
    "level1-push-pull-gaussian": ("tiny/level1", PUSH_PULL),
    "level1-push-pull-mask": ("tiny/level1", [*PUSH_PULL, "push_pull.perturbation=mask", "push_pull.scale=0.3"]),
    "level0-push-pull-gaussian": ("tiny/level0", ["push_pull.enabled=true"]),
    "level2": ("tiny/level1", ["level=2"]),
}


def objective(name: str) -> torch.nn.Module:
    """The training objective of a tiny config (a latent level on a random base of its width and depth)."""
    config, overrides = OBJECTIVES[name]
    cfg = load_run_config(config, overrides)
    torch.manual_seed(0)
    base = build_nested([cfg.encoder] * cfg.level).requires_grad_(False).eval() if cfg.level >= 1 else None
    return build_model(cfg, base).train()


@pytest.mark.parametrize("name", OBJECTIVES)
def test_noise_drawn_outside_the_forward_is_the_forward_s_own_draw(name: str) -> None:
    model = objective(name)
    x = torch.randn(3, 12, 2250, generator=torch.Generator().manual_seed(1))
    own = model(x, generator=torch.Generator().manual_seed(7))
    noise = model.draw_noise(3, torch.Generator().manual_seed(7))
    given = model(x, noise=noise)
    assert torch.equal(own["loss"], given["loss"]) and torch.equal(own["mask"], given["mask"])
    assert torch.equal(own["pred"], given["pred"])
    other = model(x, noise=model.draw_noise(3, torch.Generator().manual_seed(8)))
    assert not torch.equal(own["mask"], other["mask"])  # the noise decides the mask
    assert noise["mask"].shape == (3, 12, 30) and ("perturb" in noise) == ("push-pull" in name)


@pytest.mark.parametrize("name", OBJECTIVES)
def test_the_training_forward_traces_as_one_graph(name: str) -> None:
    """A graph break splits the compiled step into pieces, each compiled and (CUDA graphs) captured
    on its own; a random draw with a generator inside the forward was one."""
    model = objective(name)
    x = torch.randn(2, 12, 2250)
    explained = torch._dynamo.explain(model)(x, noise=model.draw_noise(2, torch.Generator().manual_seed(0)))
    reasons = [r.reason.splitlines()[0] for r in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons


def test_a_compiled_cpu_run_follows_the_eager_run(shards: Path, tmp_path: Path) -> None:
    """Same seed, same losses (fp32: Inductor only reorders sums); validation and figures run the
    uncompiled forward, so the run compiles one graph, the training forward."""
    flags = ["--set", "optim.steps=4", "--set", "train.val_fraction=0.25", "--set", "train.val_every=2"]
    flags += ["--set", "train.figure_every=2", "--set", "train.val_batches=2"]
    assert pretrain(0, shards, tmp_path / "eager", *flags, "--set", "train.compile=false") == 0
    counters.clear()
    assert pretrain(0, shards, tmp_path / "compiled", *flags, "--set", "train.compile=true") == 0
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    eager, compiled = metrics(tmp_path / "eager"), metrics(tmp_path / "compiled")
    assert [r["step"] for r in eager] == [r["step"] for r in compiled] and len(eager) >= 6
    for a, b in zip(eager, compiled):
        for key in ("loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4), (key, a, b)
    assert len(list((tmp_path / "compiled" / "figures").glob("*.png"))) >= 2
