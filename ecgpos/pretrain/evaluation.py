"""What the trainer computes besides training steps: the validation pass and the training figures.

Both run the bare (unwrapped) objective eagerly in eval mode and put it back in train mode; the caller
keeps the frozen levels below the trained one in eval mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ecgpos.pretrain.carving import shard_violations
from ecgpos.pretrain.data import ShardDataset, eval_batches, eval_loader, model_input
from ecgpos.pretrain.optim import eager_pass
from ecgpos.pretrain.schedule import step_generator
from ecgpos.runs.run_config import RunConfig, TrainConfig
from ecgpos.runs.run_folder import FIGURES_DIR


@torch.no_grad()
def validation_means(
    objective: nn.Module, val_set: ShardDataset, per_process: int, train: TrainConfig, acc: Any
) -> tuple[float, float]:
    """(validation loss, push-margin violation) over every process: the loss on `train.val_batches` fixed
    batches (centre windows, fixed masks), the carving criterion on every validation record, each perturbed
    from its own seed. The bare module: a process may have no batch, and DDP's forward would wait."""
    objective.eval()
    numbered = eval_batches(val_set, per_process, train.val_batches, acc.process_index, acc.num_processes)
    total = torch.zeros(4, device=acc.device)
    batches = eval_loader(val_set, [b for _, b in numbered], 0)
    for (k, _), x in zip(numbered, batches):
        x = model_input(x, acc.device)
        with eager_pass():
            out = objective(x, generator=step_generator(train.seed, 0, k, salt=1, device=acc.device))
        count = torch.tensor(float(len(x)), device=total.device)
        total[:2] += torch.stack([out["loss"].detach().float() * count, count])
    violations = shard_violations(objective, val_set, per_process, acc.device, acc.process_index, acc.num_processes)
    total[2:] += torch.tensor([sum(violations.values()), float(len(violations))], device=total.device)
    objective.train()
    if acc.num_processes > 1:
        total = acc.reduce(total, reduction="sum")
    return float(total[0] / total[1].clamp_min(1)), float(total[2] / total[3].clamp_min(1))


@torch.no_grad()
def training_figures(
    objective: nn.Module,
    figure_set: ShardDataset,
    cfg: RunConfig,
    acc: Any,
    run_dir: Path,
    metrics_path: Path,
    step: int,
) -> None:
    """The reconstruction of the first figure record at `step`, and the training curves so far, under
    RUN_DIR/figures (main process only)."""
    from ecgpos.pretrain.figures import plot_training_curves, plot_training_step

    objective.eval()
    x = model_input(figure_set[0][None], acc.device)
    with acc.autocast(), eager_pass():
        out = objective(x, generator=step_generator(cfg.train.seed, 0, 0, salt=2, device=acc.device))
    objective.train()
    folder = run_dir / FIGURES_DIR
    title = f"step {step}: loss {float(out['loss']):.4f} on {figure_set.index.record_id[0]}"
    if cfg.level == 0:
        tensors = {"recon": objective.in_patch_units(x, out["pred"])[0].float()}
    else:
        tensors = {"target": out["target"][0].float(), "pred": out["pred"][0].float()}
    arrays = {"mask": out["mask"][0].cpu().numpy(), **{k: v.cpu().numpy() for k, v in tensors.items()}}
    x_np = x[0].float().cpu().numpy()
    plot_training_step(cfg.level, x_np, arrays, folder, step, cfg.preprocess.fs, title)
    plot_training_curves(metrics_path, folder / "curves.png", f"{run_dir.name} (level {cfg.level})")
