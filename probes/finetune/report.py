"""summary.md's protocol section of a fine-tuning run, and the settings `probe --compare` compares."""

from __future__ import annotations

import json
from collections.abc import Sequence

from ecgpos.config import to_dict
from ecgpos.ecg.spec import PreprocessSpec
from ecgpos.probes.finetune.config import FinetuneConfig, Mode
from ecgpos.probes.shared.task_data import task_windows
from ecgpos.probes.shared.tasks import TASKS


def finetune_protocol(cfg: FinetuneConfig, mode: Mode) -> dict:
    """The probe.json `config` keys `probe --compare` reads: `protocol` (here the fine-tuning mode, optimiser
    and augmentations, flattened), `seeds` and the windows, so a comparison names what differs
    (the optimiser and augmentations as one line each: beside a linear probe every one of them differs)."""
    flat = {
        "fine-tuning": mode.protocol,
        "fine-tuning optimiser": json.dumps(to_dict(cfg.tune)),
        "fine-tuning augment": json.dumps(to_dict(cfg.augment)),
    }
    keys = ("seeds", "ptbxl_records", "windows_ptbxl", "windows_cpsc2018", "windows_csn", "windows_custom")
    return {"protocol": flat, **{k: getattr(cfg, k) for k in keys}}


def _trains(mode: Mode) -> str:
    if mode.kind == "full":
        return "every parameter of every level trains"
    if mode.kind == "lp-ft":
        return "the head alone first (linear probe, tune.lp_epochs epochs), then every parameter from that head"
    if mode.kind == "lora":
        return (
            f"rank-{mode.k} adapters on each block's attention (qkv, proj) and MLP (fc1, fc2) projections and the "
            "head train; the adapters are merged into the weights afterwards"
        )
    if mode.k == 0:
        return "the head alone trains (a linear probe on the frozen encoder, with crops and augmentations)"
    return f"the top {mode.k} blocks (counted across levels), everything above them and the head train"


def _schedule_text(warmup: float, epochs: int, min_lr: float) -> str:
    """The lr schedule as it runs: a warm-up longer than the run is capped at it, and then no cosine follows."""
    if warmup >= epochs:
        capped = f" (tune.warmup_epochs {warmup:g} capped at the run's {epochs})" if warmup > epochs else ""
        return f"linear warm-up throughout all {epochs} epochs{capped}, no cosine phase"
    return f"{warmup:g} warm-up epochs of {epochs} then cosine to {min_lr:g}"


def protocol_markdown(cfg: FinetuneConfig, mode: Mode, tasks: Sequence[str], spec: PreprocessSpec) -> str:
    o, a = cfg.tune, cfg.augment
    datasets = dict.fromkeys(TASKS[t].dataset if t in TASKS else "custom" for t in tasks)
    windows = ", ".join(f"{d} {task_windows(cfg, d)}" for d in datasets)
    return "\n".join(
        [
            "## Protocol (fine-tuning)",
            "",
            f"- Mode {mode.protocol}: {_trains(mode)}.",
            f"- Optimiser: AdamW (betas {o.betas[0]:g}, {o.betas[1]:g}), weight decay {o.weight_decay:g} (not on "
            f"biases, norms, tokens and embeddings), lr {o.lr:g} (= {o.base_lr:g} x batch {o.batch_size} / 256), "
            f"layer-wise decay {o.layer_decay:g} over all blocks of all levels, drop path {o.drop_path:g}, "
            f"{_schedule_text(o.warmup_epochs, o.epochs, o.min_lr)}, "
            f"gradient norm clipped at {o.grad_clip:g}; binary cross-entropy with logits.",
            f"- Training input: a random {spec.window}-sample window of each record per step, augmented: time shift "
            f"(p {a.p_shift:g}, up to {a.shift:g} of the window), amplitude scale (p {a.p_scale:g}, +-{a.scale:g}), "
            f"baseline wander (p {a.p_wander:g}, {a.wander:g}), Gaussian noise (p {a.p_noise:g}, std {a.noise:g}), "
            f"lead dropout (p {a.p_dropout:g}, each lead {a.dropout:g}).",
            f"- Evaluation: the head on the encoder's features averaged over each record's windows ({windows}), "
            "as the probes average. Each seed keeps its epoch of highest validation macro-AUROC (the first if "
            "tied); the test split is scored once, with that epoch's weights.",
            f"- Seeds 0-{cfg.seeds - 1}: a seed draws the head's initialisation, the batch order, the crops and the "
            "augmentations; the label subsets are MERL's, the same as the probe's.",
        ]
    )
