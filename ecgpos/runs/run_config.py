"""Run configs for `ecgpos pretrain`: YAML files mapped onto these dataclasses (ecgpos.config).

A `RunConfig` says everything a pretraining run depends on except where the data and the
Level-0 encoder live (command-line paths). Impossible values raise ConfigError (one line) when
the config is built, i.e. before any data is read or any model is created.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from ecgpos.config import load_config, to_dict
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.errors import ConfigError
from ecgpos.models.decoder import DecoderConfig
from ecgpos.models.masking import check_mask_ratio
from ecgpos.models.st_mem import EncoderConfig
from ecgpos.objectives.push_pull import PushPullConfig
from ecgpos.resources import config_path

MIXED_PRECISION = ("auto", "no", "bf16")


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule (paper: every level alike)."""

    lr: float = 3.75e-5
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 15_000
    min_lr: float = 1e-6
    steps: int = 150_000
    grad_clip: float = 1.0  # max global grad norm; 0 disables clipping

    def __post_init__(self) -> None:
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        if self.steps < 1:
            raise ConfigError(f"optim.steps must be >= 1, got {self.steps}")
        if self.warmup_steps < 0:  # > steps is allowed: a shortened run (--set optim.steps=2) stays in warm-up
            raise ConfigError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr <= self.lr:
            raise ConfigError(f"optim.min_lr must lie in [0, optim.lr={self.lr}], got {self.min_lr}")
        if self.weight_decay < 0 or self.eps <= 0 or self.grad_clip < 0:
            raise ConfigError("optim.weight_decay and optim.grad_clip must be >= 0 and optim.eps > 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {list(self.betas)}")


SEED_MAX = 2**32 - 1


@dataclass
class TrainConfig:
    """Batching, precision, data loading and the run folder's cadence (all in optimizer steps)."""

    batch_size: int = 64  # global: per-process batch * processes * grad_accum
    grad_accum: int = 1
    mixed_precision: Literal["auto", "no", "bf16"] = "auto"
    num_workers: int = 4  # DataLoader workers per process
    seed: int = 0
    log_every: int = 50
    checkpoint_every: int = 5_000
    keep_checkpoints: int = 3
    figure_every: int = 5_000
    val_fraction: float = 0.0  # records held out (by record id) for the validation loss
    val_every: int = 5_000
    val_batches: int = 8
    # torch.compile of the whole model: "auto" (CUDA graphs on one CUDA process, eager otherwise),
    # false (eager, the reference), true (= "default"), or a torch.compile mode
    compile: bool | Literal["auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "auto"

    def __post_init__(self) -> None:
        for name in (
            "batch_size",
            "grad_accum",
            "log_every",
            "checkpoint_every",
            "keep_checkpoints",
            "figure_every",
            "val_every",
            "val_batches",
        ):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ConfigError(f"train.num_workers must be >= 0, got {self.num_workers}")
        if not 0 <= self.seed <= SEED_MAX:  # numpy's SeedSequence and torch.manual_seed accept this range
            raise ConfigError(f"train.seed must be in 0..{SEED_MAX}, got {self.seed}")
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"train.batch_size {self.batch_size} is not a multiple of train.grad_accum {self.grad_accum}"
            )
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"train.val_fraction must lie in [0, 1), got {self.val_fraction}")


@dataclass
class RunConfig:
    """One pretraining run of level `level`. Level 0: `encoder` is the ST-MEM encoder over raw ECG.
    Level N >= 1: `encoder` is the latent encoder over the tokens of levels 0..N-1 (its width and
    token layout must equal theirs); one latent config serves every level >= 1."""

    KEY_ALIASES: ClassVar[dict[str, str]] = {"stage": "level"}  # `stage:` in a config or saved run reads as level

    level: int = 0
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    mask_ratio: float = 0.75
    norm_target: bool = True
    push_pull: PushPullConfig = field(default_factory=PushPullConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    preprocess: PreprocessSpec = field(default_factory=PreprocessSpec)

    def __post_init__(self) -> None:
        if isinstance(self.level, bool) or not isinstance(self.level, int) or self.level < 0:
            raise ConfigError(f"level must be an integer >= 0 (the level trained), got {self.level!r}")
        if self.preprocess.window % self.encoder.patch_size:
            raise ConfigError(
                f"preprocess.window {self.preprocess.window} is not a multiple of "
                f"encoder.patch_size {self.encoder.patch_size}"
            )
        if self.encoder.seq_len != self.preprocess.window:
            raise ConfigError(
                f"encoder.seq_len {self.encoder.seq_len} must equal preprocess.window {self.preprocess.window}"
            )
        if self.encoder.num_leads != len(self.preprocess.leads):
            raise ConfigError(
                f"encoder.num_leads {self.encoder.num_leads} must equal the "
                f"{len(self.preprocess.leads)} leads of the preprocessing spec"
            )
        check_mask_ratio(self.mask_ratio, self.encoder.num_patches)
        if self.level == 0 and self.push_pull.lambda_sp > 0:
            raise ConfigError("push_pull.lambda_sp penalises a latent level's code; at level 0 it must be 0")


def load_run_config(path: str | Path | None, overrides: Sequence[str] = (), level: int | None = None) -> RunConfig:
    """YAML file (+ `a.b=v` overrides) -> RunConfig. `level` (from --level) overrides the file's
    level when the file omits it, and a latent config's (level >= 1) for any level >= 1: one latent
    config serves every level. Any other contradicting value is a ConfigError. `path` may also
    name a shipped config ('level0', 'tiny/level1')."""
    if path is not None:
        path = config_path(path)
    cfg = load_config(RunConfig, path, overrides)
    if level is not None and cfg.level >= 1 and level >= 1:
        return dataclasses.replace(cfg, level=level)
    if level is not None and cfg.level != level:
        from ecgpos.config import read_yaml

        keys = ("level", *RunConfig.KEY_ALIASES)
        if (
            path is not None
            and any(key in read_yaml(path) for key in keys)
            or any(o.split("=", 1)[0].strip() in keys for o in overrides)
        ):
            raise ConfigError(f"--level {level} contradicts level: {cfg.level} in the config")
        cfg = dataclasses.replace(cfg, level=level)
    return cfg


# Keys that only change how a run is operated, not what it computes: they may differ between
# the run's saved config.yaml and the command line on --resume. grad_accum only with the number of
# processes, so that each step's global batch is cut into the same slices (the trainer checks that).
OPERATIONAL_KEYS = (
    "train.grad_accum",
    "train.num_workers",
    "train.log_every",
    "train.checkpoint_every",
    "train.keep_checkpoints",
    "train.figure_every",
    "train.val_every",
    "train.val_batches",
    "train.mixed_precision",
    "train.compile",
)


def flat_dict(cfg: Any) -> dict[str, Any]:
    """Dotted-key view of a config (for comparisons and messages)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}{key}.", value)
        else:
            out[prefix.rstrip(".")] = node

    walk("", to_dict(cfg) if dataclasses.is_dataclass(cfg) else cfg)
    return out


def config_differences(saved: RunConfig, new: RunConfig) -> list[str]:
    """Keys (other than OPERATIONAL_KEYS) whose values differ, as 'key: saved -> new'."""
    a, b = flat_dict(saved), flat_dict(new)
    return [
        f"{k}: {a.get(k)!r} -> {b.get(k)!r}"
        for k in sorted(set(a) | set(b))
        if k not in OPERATIONAL_KEYS and a.get(k) != b.get(k)
    ]
