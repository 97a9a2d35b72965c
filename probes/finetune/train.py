"""Training one classifier (one task, label fraction and seed) on Accelerate: random crops and augmentations
per step, the epoch of best validation macro-AUROC kept, the test split scored once with it at the end."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from ecgpos.ecg.signal import pad_to
from ecgpos.errors import EcgposError
from ecgpos.metrics import auroc_columns
from ecgpos.models.features import record_means, record_windows
from ecgpos.pretrain.api import (
    LRSchedule,
    compile_failure,
    compile_model,
    compile_name,
    quiet_compile_logs,
    resolve_compile,
    uncompile_model,
)
from ecgpos.probes.finetune.augment import augment, random_crop
from ecgpos.probes.finetune.config import AugmentConfig, Mode, OptimConfig
from ecgpos.probes.finetune.lora import merge_lora
from ecgpos.probes.finetune.model import Classifier, bare_encoder, blocks, frozen_below, param_groups, prepare_mode


@dataclass
class Split:
    """One split's records (object array of (12, T) float32), labels (N, C) and record keys."""

    signals: np.ndarray
    labels: np.ndarray
    keys: list[str]


@dataclass
class Trained:
    """A trained classifier (LoRA merged, on the CPU, eval mode) and what selected it."""

    model: Classifier
    best_epoch: int  # 1-based
    val_auroc: float
    val_scores: np.ndarray  # (N_val, C) logits of the selected epoch
    test_scores: np.ndarray  # (N_test, C) logits, read once
    epochs_run: int
    compiled: str = "eager"  # how the training forward ran: "eager", "default" or a torch.compile mode


def macro_auroc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Macro-AUROC over the classes with a positive and a negative (NaN when none): the selection metric."""
    labels = np.asarray(labels)
    valid = (labels.sum(0) > 0) & (labels.sum(0) < len(labels))
    if not valid.any():
        return float("nan")
    return float(auroc_columns(scores[:, valid], labels[:, valid]).mean())


@torch.no_grad()
def record_logits(
    model: Classifier, split: Split, window: int, windows: int, batch_size: int, device: torch.device, acc=None
) -> np.ndarray:
    """(N, C) logits: the head on each record's features averaged over its windows, as the probes average
    (for a linear head the same as averaging the windows' logits)."""
    model.eval()

    def features(batch: np.ndarray) -> dict[str, np.ndarray]:
        with acc.autocast() if acc is not None else contextlib.nullcontext():
            out = model.features(torch.from_numpy(np.ascontiguousarray(batch, np.float32)).to(device))
        return {"features": out.float().cpu().numpy()}

    per_record = ((k, record_windows(pad_to(x, window), window, windows)) for k, x in enumerate(split.signals))
    means = [m["features"] for _, m in record_means(per_record, features, batch_size)]
    if not means:
        return np.zeros((0, model.head.out_features), np.float32)
    return model.head(torch.from_numpy(np.stack(means)).to(device)).float().cpu().numpy()


def _batches(n: int, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch's batches of a fresh permutation; a last short batch is kept (1 % fractions are small)."""
    order = rng.permutation(n)
    return [order[i : i + batch_size] for i in range(0, n, batch_size)]


def _schedule(optim: OptimConfig, epochs: int, steps_per_epoch: int, warmup_epochs: float) -> LRSchedule:
    steps = max(1, epochs * steps_per_epoch)
    return LRSchedule(
        lr=optim.lr, warmup_steps=int(round(warmup_epochs * steps_per_epoch)), min_lr=optim.min_lr, steps=steps
    )


def fit(
    model: Classifier,
    mode: Mode,
    train: Split,
    val: Split,
    optim: OptimConfig,
    aug: AugmentConfig,
    fs: float,
    window: int,
    windows: int,
    seed: int,
    acc,
    epochs: int,
    eval_batch: int,
    label: str = "",
    compile: bool | str = False,
) -> tuple[Classifier, int, float, np.ndarray, str]:
    """Train `model` under `mode` for `epochs`; the state of the best validation macro-AUROC epoch is loaded
    back (epoch 1 when no epoch has a finite one). Returns (model, best epoch 1-based, its val AUROC, its
    val logits, how the forward ran: compile_name). With `compile` (the fine-tuning `compile` setting) the
    training forward compiles at the first step; "auto" that cannot compile trains eagerly after one line,
    an explicit mode stops with one line. Every process draws the same permutation (one generator for the
    order) and takes its share of each batch, with crops and augmentations of its own (generators seeded
    with its index)."""
    prepare_mode(model, mode, optim)
    device = acc.device
    model.to(device)
    optimizer = torch.optim.AdamW(param_groups(model, optim), lr=optim.lr, betas=optim.betas)
    wrapped, optimizer = acc.prepare(model, optimizer)
    compiled = resolve_compile(compile, device, acc.num_processes)
    compile_model(model, compiled)
    order = np.random.default_rng([seed, 1])
    crops = np.random.default_rng([seed, 2, acc.process_index])
    generator = torch.Generator(device=device).manual_seed(int(crops.integers(2**62)))
    steps_per_epoch = -(-len(train.keys) // optim.batch_size)
    schedule = _schedule(optim, epochs, steps_per_epoch, min(optim.warmup_epochs, epochs))  # a short run: all warm-up
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = frozen_below(model)
    loss_fn = nn.BCEWithLogitsLoss()
    best = (-np.inf, 0, None, None)
    step = 0
    bar = tqdm(range(epochs), desc=f"{label} {mode.protocol} seed {seed}", unit="epoch", leave=False)
    for epoch in bar:
        model.train()
        if frozen:
            model.encoder.eval()
        for rows in _batches(len(train.keys), optim.batch_size, order):
            mine = rows[acc.process_index :: acc.num_processes]
            if not len(mine):
                mine = rows[:1]  # a batch smaller than the process count: every process must step
            x = np.stack([random_crop(train.signals[i], window, crops) for i in mine])
            batch = augment(torch.from_numpy(x).to(device), aug, fs, generator)
            target = torch.from_numpy(train.labels[mine].astype(np.float32)).to(device)
            for group in optimizer.param_groups:
                group["lr"] = schedule.at(step) * group["lr_scale"]
            try:
                with quiet_compile_logs() if step == 0 else contextlib.nullcontext():
                    with acc.autocast():
                        loss = loss_fn(wrapped(batch).float(), target)
                    acc.backward(loss)
            except Exception as error:  # noqa: BLE001 - a compile that fails is named in one line
                if step > 0 or compiled is False:
                    raise
                compiled = _compile_fallback(model, compile, error)
                optimizer.zero_grad(set_to_none=True)
                with acc.autocast():
                    loss = loss_fn(wrapped(batch).float(), target)
                acc.backward(loss)
            acc.clip_grad_norm_(trainable, optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
        scores = record_logits(model, val, window, windows, eval_batch, device, acc)
        auroc = macro_auroc(val.labels, scores)
        bar.set_postfix(val_auroc=f"{auroc:.3f}")
        if auroc > best[0] or best[2] is None:
            state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            best = (auroc if np.isfinite(auroc) else -np.inf, epoch + 1, state, scores)
    acc.free_memory()
    uncompile_model(model)  # the selected classifier leaves as a plain module (export, scoring)
    model.load_state_dict(best[2])
    return model, best[1], float(best[0]) if np.isfinite(best[0]) else float("nan"), best[3], compile_name(compiled)


def _compile_fallback(model: nn.Module, requested: bool | str, error: Exception) -> bool:
    """The first step failed compiled: "auto" says why in one line and goes on eagerly (-> False); an
    explicit setting stops with one line."""
    cause = compile_failure(error)
    if requested != "auto":
        raise EcgposError(f"compile={requested} cannot compile the fine-tuning step ({cause}); use --set compile=false")
    print(f"ecgpos finetune: warning: compile=auto could not compile the fine-tuning step ({cause}); training eagerly")
    uncompile_model(model)
    return False


def train_classifier(
    encoder: nn.Module,
    num_classes: int,
    mode: Mode,
    splits: dict[str, Split],
    optim: OptimConfig,
    aug: AugmentConfig,
    fs: float,
    window: int,
    windows: int,
    seed: int,
    acc,
    eval_batch: int = 64,
    label: str = "",
    compile: bool | str = False,
) -> Trained:
    """A fresh copy of `encoder` with a head, trained under `mode` (lp-ft: the head alone for lp_epochs, then
    everything from that head), selected on validation, then the test split scored once."""
    torch.manual_seed(seed)
    model = Classifier(copy.deepcopy(bare_encoder(encoder)).train(), num_classes, optim.head_init_std)
    args = (splits["train"], splits["val"], optim, aug, fs, window, windows, seed, acc)
    last = mode
    if mode.kind == "lp-ft":
        model, *_ = fit(model, Mode("top", 0), *args, optim.lp_epochs, eval_batch, label, compile)
        last = Mode("full")
    model, best_epoch, val_auroc, val_scores, compiled = fit(
        model, last, *args, optim.epochs, eval_batch, label, compile
    )
    merge_lora(blocks(model.encoder))
    model.requires_grad_(False).eval()
    test_scores = record_logits(model, splits["test"], window, windows, eval_batch, acc.device, acc)
    model.cpu()
    epochs = optim.epochs + (optim.lp_epochs if mode.kind == "lp-ft" else 0)
    return Trained(model, best_epoch, val_auroc, val_scores, test_scores, epochs, compiled)


def class_aurocs(labels: np.ndarray, scores: np.ndarray, classes: Sequence[str]) -> tuple[list[str], dict]:
    """(classes left out for lacking a positive or a negative, {class: AUROC} of the others)."""
    from ecgpos.probes.shared.metrics import macro_auroc_sklearn

    _, per_class = macro_auroc_sklearn(labels, scores, classes)
    return [c for c in classes if c not in per_class], per_class
