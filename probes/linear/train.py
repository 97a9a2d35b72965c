"""The linear-probe protocol (MERL's, as the paper uses it), with every seed trained at once.

One linear layer on frozen features, binary cross-entropy, Adam (lr 1e-3, weight decay 1e-4),
batch 16, 100 epochs, lr x 0.1 from epoch 41 on (counted from 1; per epoch), best-validation-macro-AUROC
epoch selected and its test macro-AUROC reported.

Speed: the S seeds of one (task, fraction) are one batched linear layer, parameters P of shape
(S, D+1, C) (the bias is the last row, features get a column of ones). Every seed draws its
own permutation each epoch and takes its own Adam step; because the loss is a sum of per-seed
losses and Adam is elementwise, this is the same computation as S separate runs. Gradients and
Adam are written out by hand (no autograd, no optimizer objects): at 16 rows a step, Python
overhead, not arithmetic, is the cost. `reference_run` is the plain one-run-at-a-time
DataLoader + nn.Linear + torch.optim.Adam loop that tests and the benchmark compare against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.metrics import auroc_columns, macro_auroc_sklearn


@dataclass(frozen=True)
class ProtocolConfig:
    """The probe optimiser; defaults are the paper's protocol."""

    epochs: int = 100
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 1e-4
    lr_drop_epochs: tuple[int, ...] = (40,)  # lr is multiplied by lr_drop_factor from each of these epochs on
    lr_drop_factor: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)  # torch.optim.Adam defaults
    eps: float = 1e-8


def check_protocol(protocol: ProtocolConfig) -> None:
    """The optimiser settings a probe can train with: a zero batch divided by zero after the extraction,
    and a negative learning rate, weight decay or drop factor trained the probes the wrong way silently."""
    bad = [f"batch_size={protocol.batch_size}"] if protocol.batch_size < 1 else []
    bad += [f"{k}={getattr(protocol, k)}" for k in ("lr", "eps", "lr_drop_factor") if not getattr(protocol, k) > 0]
    bad += [f"weight_decay={protocol.weight_decay}"] if protocol.weight_decay < 0 else []
    bad += [f"lr_drop_epochs={list(protocol.lr_drop_epochs)}"] if any(e < 0 for e in protocol.lr_drop_epochs) else []
    bad += [f"betas={list(protocol.betas)}"] if not all(0 <= b < 1 for b in protocol.betas) else []
    if bad:
        raise EcgposError(
            f"protocol {', '.join(bad)}: batch_size must be at least 1, lr, eps and lr_drop_factor above 0, "
            "weight_decay and lr_drop_epochs 0 or more, betas in [0, 1)"
        )


def lr_at_epoch(cfg: ProtocolConfig, epoch: int) -> float:
    """Learning rate of 0-based `epoch` (MultiStepLR stepped once per epoch)."""
    drops = sum(1 for e in cfg.lr_drop_epochs if epoch >= e)
    return cfg.lr * cfg.lr_drop_factor**drops


def epoch_permutations(seed: int, n: int, epochs: int) -> torch.Tensor:
    """(epochs, n) int64: the row order of every epoch of seed `seed` (its own generator)."""
    gen = torch.Generator().manual_seed(int(seed))
    return torch.stack([torch.randperm(n, generator=gen) for _ in range(epochs)])


def init_linear(seed: int, in_dim: int, out_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """nn.Linear's default init drawn from a seed: weight (out, in), bias (out,), U(-1/sqrt(in), 1/sqrt(in))."""
    gen = torch.Generator().manual_seed(int(seed) + 1_000_003)  # distinct stream from the permutations
    bound = 1.0 / np.sqrt(in_dim)
    weight = (torch.rand(out_dim, in_dim, generator=gen) * 2 - 1) * bound
    bias = (torch.rand(out_dim, generator=gen) * 2 - 1) * bound
    return weight, bias


@dataclass
class SeedResult:
    """One seed's outcome; `val_curve` is the validation macro-AUROC of every epoch."""

    seed: int
    best_epoch: int  # 0-based epoch index with the highest validation macro-AUROC (first if tied)
    val_auroc: float
    test_auroc: float
    test_per_class: dict[str, float]
    val_curve: list[float] = field(default_factory=list)


@dataclass
class ProbeOutcome:
    """All seeds of one (task, fraction) plus which classes each split could not score."""

    seeds: list[SeedResult]
    excluded_val: list[str]
    excluded_test: list[str]
    lrs: list[float]
    best_params: torch.Tensor  # (S, D+1, C): [W^T; b] of each seed's selected epoch
    last_params: torch.Tensor  # (S, D+1, C) after the last epoch
    test_scores: np.ndarray | None = None  # (S, Nt, C) float32 logits of each seed's selected epoch (bootstrap)


def _with_ones(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    x = torch.as_tensor(np.asarray(x, dtype=np.float32))
    return torch.cat([x, torch.ones(len(x), 1)], dim=1)


def _valid_classes(y: np.ndarray) -> np.ndarray:
    """Classes with at least one positive and one negative (AUROC defined)."""
    pos = y.sum(axis=0)
    return (pos > 0) & (pos < len(y))


def _epoch(
    xt: torch.Tensor,
    yt: torch.Tensor,
    perms: torch.Tensor,
    params: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    lr: float,
    col_scale: torch.Tensor,
    cfg: ProtocolConfig,
) -> torch.Tensor:
    """One epoch of every seed: xt (N, D+1), yt (N, C), perms (S, N), params/Adam state (S, D+1, C).

    col_scale (C,): 1 / (classes of the column's task), so each task's loss is its own BCE mean.
    """
    num_seeds, n = perms.shape
    bsz, n_cls = cfg.batch_size, yt.shape[1]
    full = n // bsz
    # batch-major layout: batch i of every seed is one contiguous (S*b,) index block, its labels (S, b, C)
    blocks = []
    if full:
        blocks.append((perms[:, : full * bsz].reshape(num_seeds, full, bsz).transpose(0, 1).reshape(full, -1), bsz))
    if n % bsz:
        blocks.append((perms[:, full * bsz :].reshape(1, -1), n % bsz))
    for index, b in blocks:
        labels = yt.index_select(0, index.reshape(-1)).view(len(index), num_seeds, b, n_cls)
        scale = col_scale / b  # BCE mean over the b*C elements of a batch
        for i in range(len(index)):
            xb = xt.index_select(0, index[i]).view(num_seeds, b, -1)  # (S, b, D+1)
            grad_z = torch.bmm(xb, params).sigmoid_().sub_(labels[i]).mul_(scale)  # dLoss/dz, (S, b, C)
            grad = torch.bmm(xb.transpose(1, 2), grad_z)  # (S, D+1, C)
            step += 1
            # torch.optim.Adam(fused=True)'s kernel: L2 weight decay added to the gradient, bias-corrected
            torch._fused_adam_(
                [params],
                [grad],
                [exp_avg],
                [exp_avg_sq],
                [],
                [step],
                amsgrad=False,
                lr=lr,
                beta1=cfg.betas[0],
                beta2=cfg.betas[1],
                weight_decay=cfg.weight_decay,
                eps=cfg.eps,
                maximize=False,
            )
    return step


def train_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    seeds: Sequence[int],
    class_names: Sequence[str],
    cfg: ProtocolConfig = ProtocolConfig(),
) -> ProbeOutcome:
    """Train one linear probe per seed on (N, D) features / (N, C) 0/1 labels, all seeds batched.

    Selection: each seed keeps the parameters of its epoch with the highest validation macro-AUROC
    (classes without positives or negatives in val left out); test AUROC is computed once, at
    that epoch, with scikit-learn per class.
    """
    return train_probe_groups(x_train, y_train, x_val, y_val, x_test, y_test, seeds, [list(class_names)], cfg)[0]


def train_probe_groups(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    seeds: Sequence[int],
    groups: Sequence[Sequence[str]],
    cfg: ProtocolConfig = ProtocolConfig(),
) -> list[ProbeOutcome]:
    """Several tasks on the same rows (e.g. PTB-XL super and sub) as one layer: labels (N, sum C_g),
    columns grouped task by task. Exactly the separate runs: a seed's permutations depend only on
    (seed, N), each task's columns get its own init, loss mean and best-epoch selection, and BCE and
    Adam never mix columns. One outcome per group.
    """
    n, dim = x_train.shape
    sizes = [len(g) for g in groups]
    bounds = np.cumsum([0] + sizes)
    n_cls, num_seeds, n_groups = int(bounds[-1]), len(seeds), len(groups)
    if n == 0:
        raise ValueError("no training rows")
    xt = _with_ones(x_train)  # (N, D+1)
    yt = torch.as_tensor(np.asarray(y_train, dtype=np.float32))  # (N, C)
    xv = _with_ones(x_val)
    yv = np.asarray(y_val, dtype=np.float64)
    valid_val = _valid_classes(yv)
    col_scale = torch.cat([torch.full((k,), 1.0 / k) for k in sizes])
    # P[s] = [W_s^T; b_s]: (D+1, C), each group's columns initialised as its own nn.Linear
    params = torch.empty(num_seeds, dim + 1, n_cls)
    for i, seed in enumerate(seeds):
        for g, k in enumerate(sizes):
            w, b = init_linear(seed, dim, k)
            params[i, :dim, bounds[g] : bounds[g + 1]] = w.T
            params[i, dim, bounds[g] : bounds[g + 1]] = b
    exp_avg = torch.zeros_like(params)
    exp_avg_sq = torch.zeros_like(params)
    best = params.clone()
    best_val = np.full((num_seeds, n_groups), -np.inf)
    best_epoch = np.zeros((num_seeds, n_groups), dtype=int)
    curves = np.full((num_seeds, n_groups, cfg.epochs), np.nan)
    gens = [torch.Generator().manual_seed(int(s)) for s in seeds]
    step = torch.zeros((), dtype=torch.float32)  # Adam's step count, as torch.optim keeps it
    lrs = []
    yv_tiled = np.tile(yv, (1, num_seeds))  # (Nv, S*C), seed-major like the scores below
    for epoch in range(cfg.epochs):
        lr = lr_at_epoch(cfg, epoch)
        lrs.append(lr)
        perms = torch.stack([torch.randperm(n, generator=g) for g in gens])  # (S, N) each seed its own order
        step = _epoch(xt, yt, perms, params, exp_avg, exp_avg_sq, step, lr, col_scale, cfg)
        scores = torch.matmul(xv, params.permute(1, 0, 2).reshape(dim + 1, -1))  # (Nv, S*C)
        per_class = np.full((num_seeds, n_cls), np.nan)
        if valid_val.any():
            cols = np.tile(valid_val, num_seeds)
            per_class[:, valid_val] = auroc_columns(scores[:, cols].numpy(), yv_tiled[:, cols]).reshape(num_seeds, -1)
        for g in range(n_groups):
            part = per_class[:, bounds[g] : bounds[g + 1]]
            ok = valid_val[bounds[g] : bounds[g + 1]]
            macro = part[:, ok].mean(axis=1) if ok.any() else np.full(num_seeds, np.nan)
            curves[:, g, epoch] = macro
            # first epoch with the highest value wins; NaN (nothing scorable) never wins, epoch 0 is kept
            take = (np.nan_to_num(macro, nan=-np.inf) > best_val[:, g]) | (epoch == 0)
            for i in np.flatnonzero(take):
                best[i, :, bounds[g] : bounds[g + 1]] = params[i, :, bounds[g] : bounds[g + 1]]
                best_val[i, g] = np.nan_to_num(macro[i], nan=-np.inf)
                best_epoch[i, g] = epoch
    test_logits = torch.matmul(_with_ones(x_test), best)  # (S, Nt, C) float32
    test_scores = test_logits.double().numpy()
    y_test = np.asarray(y_test)
    outcomes = []
    for g, names in enumerate(groups):
        cols = slice(bounds[g], bounds[g + 1])
        results = []
        for i, seed in enumerate(seeds):
            macro_test, per_class_test = macro_auroc_sklearn(y_test[:, cols], test_scores[i][:, cols], names)
            results.append(
                SeedResult(
                    seed=int(seed),
                    best_epoch=int(best_epoch[i, g]),
                    val_auroc=float(curves[i, g, best_epoch[i, g]]),
                    test_auroc=macro_test,
                    test_per_class=per_class_test,
                    val_curve=curves[i, g].tolist(),
                )
            )
        outcomes.append(
            ProbeOutcome(
                results,
                [c for c, ok in zip(names, valid_val[cols]) if not ok],
                [c for c, ok in zip(names, _valid_classes(y_test[:, cols])) if not ok],
                lrs,
                best[:, :, cols].clone(),
                params[:, :, cols].clone(),
                test_logits[:, :, cols].numpy().copy(),
            )
        )
    return outcomes


def reference_run(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    seed: int,
    cfg: ProtocolConfig = ProtocolConfig(),
    permutations: torch.Tensor | None = None,
) -> tuple[torch.nn.Linear, list[float], list[float]]:
    """The plain protocol for one seed: DataLoader, nn.Linear, BCEWithLogitsLoss, Adam, MultiStepLR.

    Uses the same init and (if given) the same per-epoch row order as `train_probe`'s seed, so the
    two can be compared number for number. Returns (final layer, val macro-AUROC curve, lrs).
    """
    from torch.utils.data import DataLoader, TensorDataset

    n, dim = x_train.shape
    layer = torch.nn.Linear(dim, y_train.shape[1])
    w, b = init_linear(seed, dim, y_train.shape[1])
    with torch.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    opt = torch.optim.Adam(layer.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, eps=cfg.eps)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(cfg.lr_drop_epochs), gamma=cfg.lr_drop_factor)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    data = TensorDataset(torch.as_tensor(x_train, dtype=torch.float32), torch.as_tensor(y_train, dtype=torch.float32))
    perms = permutations if permutations is not None else epoch_permutations(seed, n, cfg.epochs)
    yv = np.asarray(y_val, dtype=np.float64)
    valid = _valid_classes(yv)
    curve, lrs = [], []
    for epoch in range(cfg.epochs):
        lrs.append(opt.param_groups[0]["lr"])
        loader = DataLoader(data, batch_size=cfg.batch_size, sampler=perms[epoch].tolist())
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(layer(xb), yb).backward()
            opt.step()
        sched.step()
        with torch.no_grad():
            scores = layer(torch.as_tensor(x_val, dtype=torch.float32)).double().numpy()
        curve.append(float(auroc_columns(scores[:, valid], yv[:, valid]).mean()) if valid.any() else float("nan"))
    return layer, curve, lrs
