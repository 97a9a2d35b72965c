"""What training loops outside pretraining (ecgpos.probes.finetune) use of it: the learning-rate
schedule, the mixed-precision choice and the whole-model torch.compile with its one-line failures.

The one module of ecgpos.pretrain that ecgpos.probes imports (an import-linter contract in
pyproject.toml), so that pretraining's own modules (optim, schedule, trainer, ...) can change without
the probes, and the probes' fine-tuning schedules the learning rate and compiles as pretraining does.
"""

from __future__ import annotations

import dataclasses

from ecgpos.pretrain.optim import (
    compile_failure,
    compile_model,
    compile_name,
    quiet_compile_logs,
    resolve_compile,
    resolve_mixed_precision,
    uncompile_model,
)
from ecgpos.pretrain.schedule import lr_at
from ecgpos.runs.run_config import OptimConfig

__all__ = [
    "LRSchedule",
    "compile_failure",
    "compile_model",
    "compile_name",
    "quiet_compile_logs",
    "resolve_compile",
    "resolve_mixed_precision",
    "uncompile_model",
]


@dataclasses.dataclass(frozen=True)
class LRSchedule:
    """Pretraining's learning rate by optimizer step: linear warm-up to `lr` over `warmup_steps`, then
    cosine down to `min_lr` at `steps`, `min_lr` after (ecgpos.pretrain.schedule.lr_at). Checked as
    the run config's optim section is (ConfigError: steps >= 1, warmup_steps >= 0, 0 <= min_lr <= lr)."""

    lr: float
    warmup_steps: int
    min_lr: float
    steps: int
    _optim: OptimConfig = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        optim = OptimConfig(lr=self.lr, warmup_steps=self.warmup_steps, min_lr=self.min_lr, steps=self.steps)
        object.__setattr__(self, "_optim", optim)

    def at(self, step: int) -> float:
        """The learning rate of the update made after `step` completed optimizer steps (0 = the first)."""
        return lr_at(step, self._optim)
