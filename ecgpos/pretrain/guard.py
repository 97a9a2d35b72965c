"""Non-finite steps decided on the device: the update is skipped there, the host learns it later.

Each step the guard turns "is the loss, every logged term and the global grad norm finite?" into
a flag on the device (max-reduced over processes, so every process decides alike) and hands the
optimizer a sticky `found_inf`: 1.0 from the first non-finite step on. The fused AdamW kernel
leaves parameters, moments and its step count untouched when it reads 1.0 (the mechanism
torch's GradScaler uses), so neither the bad step nor any later one reaches the weights, and
nothing waits for the device. The trainer reads the flag only where it has to act on it (log,
validation, figure and checkpoint steps, the end): the weights are then still those of the last
good step, and no checkpoint is ever written after a non-finite step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class NonFiniteStep:
    """The first non-finite step (1-based) and its loss and grad norm."""

    step: int
    loss: float
    grad_norm: float


class NonFiniteGuard:
    def __init__(self, device: torch.device, num_processes: int) -> None:
        self.num_processes = num_processes
        self.found_inf = torch.zeros((), device=device)  # float32 0/1: what the fused kernel reads
        self.first = torch.zeros(3, dtype=torch.float64, device=device)  # step, loss, grad norm

    def update(self, step: int, stats: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Record step `step` (0-based; stats[0] is the loss) -> the optimizer's found_inf flag."""
        bad = (~(torch.isfinite(stats).all() & torch.isfinite(grad_norm))).float()
        if self.num_processes > 1:  # queued like the gradients' all-reduce: no wait on the host
            torch.distributed.all_reduce(bad, op=torch.distributed.ReduceOp.MAX)
        new = (bad > 0) & (self.found_inf == 0)
        values = torch.stack([stats[0].double(), grad_norm.detach().double()])
        self.first[1:] = torch.where(new, values, self.first[1:])
        self.first[0] = torch.where(new, float(step + 1), self.first[0])  # a Python scalar: no copy to the device
        self.found_inf = torch.maximum(self.found_inf, bad)
        return self.found_inf

    def check(self) -> NonFiniteStep | None:
        """Read the flag on the host (waits for the device): the first non-finite step, or None."""
        step, loss, grad_norm = self.first.tolist()
        if step == 0:
            return None
        return NonFiniteStep(int(step), loss, grad_norm)
