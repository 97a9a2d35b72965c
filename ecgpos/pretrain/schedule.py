"""Learning rate and random draws as pure functions of the optimizer step.

No LambdaLR: Accelerate steps a prepared scheduler once per process per optimizer step, so a
scheduler object would run faster with more processes. The trainer instead sets each param
group's lr from `lr_at(step)` before every optimizer step, which is right for any number of
processes, any gradient accumulation, and after a resume (nothing to save). The random numbers of
a step (masks, push-pull noise) come from `step_generator`, seeded the same way.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ecgpos.runs.run_config import OptimConfig


def lr_at(step: int, optim: OptimConfig) -> float:
    """Learning rate of the update made after `step` completed optimizer steps (step 0 = first update).

    Linear warm-up: lr * (step + 1) / warmup_steps for step < warmup_steps (so the first update is
    not a no-op and update warmup_steps - 1 uses the full lr); then cosine from lr at
    step = warmup_steps down to min_lr at step = steps; min_lr after that.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    decay_steps = optim.steps - optim.warmup_steps
    if decay_steps <= 0 or step >= optim.steps:
        return optim.min_lr if step >= optim.steps else optim.lr
    progress = (step - optim.warmup_steps) / decay_steps
    return optim.min_lr + (optim.lr - optim.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def step_generator(
    seed: int, step: int, slice_index: int, salt: int = 0, device: torch.device | str = "cpu"
) -> torch.Generator:
    """Generator for the masks of one micro-batch slice of one step, on `device`: the numbers are
    drawn where the model runs (no copy that waits), and the same seed gives the same run on a
    given device type (CPU and CUDA streams differ)."""
    value = np.random.SeedSequence([seed, salt, step, slice_index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(value))
