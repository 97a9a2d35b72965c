"""Fine-tuning settings (`configs/finetune.yaml`, `--config`, `--set`) and the `--mode` they train under.

Every default and its source is listed in configs/README.md ("Fine-tuning").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.task_data import RecordSettings, check_record_settings

COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class AugmentConfig:
    """ECG augmentations of each training crop: each applied with probability `p_*` at strength `*`."""

    p_shift: float = 0.5
    shift: float = 0.1  # circular time shift of up to this fraction of the crop
    p_scale: float = 0.5
    scale: float = 0.2  # amplitude x U(1 - scale, 1 + scale), per lead
    p_wander: float = 0.3
    wander: float = 0.1  # baseline wander: a 0.05-0.5 Hz sine of this amplitude (standardised units)
    p_noise: float = 0.3
    noise: float = 0.05  # Gaussian noise of this std (standardised units)
    p_dropout: float = 0.2
    dropout: float = 0.25  # each lead zeroed with this probability


@dataclass(frozen=True)
class OptimConfig:
    """AdamW with layer-wise lr decay, warm-up then cosine to 0, per optimizer step."""

    epochs: int = 10
    warmup_epochs: float = 3.0  # capped at the run's epochs (a shorter run warms up throughout)
    batch_size: int = 64
    base_lr: float = 1e-3  # lr = base_lr x batch_size / 256
    min_lr: float = 0.0
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    layer_decay: float = 0.75
    drop_path: float = 0.1
    grad_clip: float = 1.0
    lora_alpha: float = 0.0  # LoRA scale alpha / r; 0: alpha = r (scale 1)
    lp_epochs: int = 10  # lp-ft: epochs of the linear-probe phase (then `epochs` of full fine-tuning)
    head_init_std: float = 2e-5  # MAE's fine-tuning head init: the first steps leave the pretrained features be

    @property
    def lr(self) -> float:
        return self.base_lr * self.batch_size / 256


@dataclass
class FinetuneConfig:
    """Fine-tuning settings; the fractions, seeds and record keys (RecordSettings) mean what the probe's do."""

    tune: OptimConfig = field(default_factory=OptimConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)
    seeds: int = 5
    ptbxl_records: str = RecordSettings.ptbxl_records
    windows_ptbxl: int = RecordSettings.windows_ptbxl
    windows_cpsc2018: int = RecordSettings.windows_cpsc2018
    windows_csn: int = RecordSettings.windows_csn
    windows_custom: int = RecordSettings.windows_custom
    eval_batch_size: int = 64
    device: str = "auto"  # single-process runs; under `accelerate launch` Accelerate picks each process's device
    mixed_precision: str = "auto"  # auto: bf16 on CUDA with bf16 support, else fp32
    # torch.compile of the classifier's training forward, as pretraining's train.compile: "auto"
    # (CUDA graphs on one CUDA process, eager elsewhere), false, true (= "default") or a mode
    compile: bool | str = "auto"


@dataclass(frozen=True)
class Mode:
    """What trains: `full` (everything), `top` (the top `k` blocks across levels + head), `lora` (rank-`k`
    adapters + head, merged afterwards), `lp-ft` (head alone first, then everything)."""

    kind: str
    k: int = 0

    @property
    def protocol(self) -> str:
        """The results.csv `protocol` value."""
        return f"finetune-{self.kind}" + (f":{self.k}" if self.kind in ("top", "lora") else "")


def parse_mode(text: str) -> Mode:
    """'full', 'top:K' (K >= 0), 'lora:R' (R >= 1) or 'lp-ft'; one EcgposError line otherwise."""
    text = text.strip()
    if text in ("full", "lp-ft"):
        return Mode(text)
    match = re.fullmatch(r"(top|lora):(\d+)", text)
    if match is None or (match[1] == "lora" and int(match[2]) < 1):
        raise EcgposError(f"--mode must be full, top:K (K >= 0), lora:R (R >= 1) or lp-ft, got {text!r}")
    return Mode(match[1], int(match[2]))


def check_finetune_config(cfg: FinetuneConfig) -> None:
    """One line for settings that would crash later or train the wrong way silently."""
    check_record_settings(cfg, cfg.fractions, cfg.seeds)
    o, a = cfg.tune, cfg.augment
    bad = [f"tune.{k}={getattr(o, k)}" for k in ("epochs", "batch_size") if getattr(o, k) < 1]
    bad += [f"tune.{k}={getattr(o, k)}" for k in ("base_lr", "grad_clip") if not getattr(o, k) > 0]
    bad += [
        f"tune.{k}={getattr(o, k)}"
        for k in ("min_lr", "weight_decay", "lora_alpha", "head_init_std")
        if getattr(o, k) < 0
    ]
    bad += [f"tune.lp_epochs={o.lp_epochs}"] if o.lp_epochs < 1 else []
    bad += [f"tune.warmup_epochs={o.warmup_epochs}"] if o.warmup_epochs < 0 else []
    bad += [f"tune.{k}={getattr(o, k)}" for k in ("layer_decay",) if not 0 < getattr(o, k) <= 1]
    bad += [f"tune.drop_path={o.drop_path}"] if not 0 <= o.drop_path < 1 else []
    bad += [f"tune.betas={list(o.betas)}"] if not all(0 <= b < 1 for b in o.betas) else []
    bad += [f"augment.{k}={v}" for k, v in vars(a).items() if k.startswith("p_") and not 0 <= v <= 1]
    bad += [f"augment.{k}={v}" for k, v in vars(a).items() if not k.startswith("p_") and v < 0]
    bad += [f"eval_batch_size={cfg.eval_batch_size}"] if cfg.eval_batch_size < 1 else []
    bad += [f"mixed_precision={cfg.mixed_precision!r}"] if cfg.mixed_precision not in ("auto", "no", "bf16") else []
    bad += [f"compile={cfg.compile!r}"] if cfg.compile not in (True, False, *COMPILE_MODES) else []
    if bad:
        raise EcgposError(
            f"fine-tuning settings out of range: {', '.join(bad)} (configs/README.md lists each setting's range)"
        )
