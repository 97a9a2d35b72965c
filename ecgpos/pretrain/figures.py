"""PNG figures a researcher looks at first: reconstructions and training curves (matplotlib Agg).

All functions take numpy arrays and a path, write one PNG and return the path; no pyplot state
survives a call (figures are closed), so they are safe in long training runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ecgpos.ecg.leads import CANONICAL_LEADS
from ecgpos.files import atomic_path


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # headless: cluster nodes have no display
    import matplotlib.pyplot as plt

    return plt


def _shade_masked(ax, mask_row: np.ndarray, patch_size: int, fs: float, offset: int = 0) -> None:
    """Grey spans over the masked patches of one lead; mask_row (N,) bool."""
    for j in np.flatnonzero(mask_row):
        ax.axvspan((offset + j * patch_size) / fs, (offset + (j + 1) * patch_size) / fs, color="0.85", lw=0, zorder=0)


def plot_reconstruction(
    x: np.ndarray,
    recon: np.ndarray | None,
    mask: np.ndarray,
    path: str | Path,
    fs: float = 250.0,
    title: str = "",
    leads: Sequence[str] = CANONICAL_LEADS,
) -> Path:
    """12-lead ECG: input (black), masked patches shaded, reconstruction of the masked patches (red).

    x (12, T) input window; recon (12, N, P) reconstruction in the input's units (None: only the
    mask is drawn, e.g. Level-1 token positions); mask (12, N) bool, True = masked. T = N * P.
    """
    plt = _plt()
    leads_n, t = x.shape
    n = mask.shape[1]
    patch = t // n
    time = np.arange(t) / fs
    fig, axes = plt.subplots(leads_n, 1, figsize=(14, 1.1 * leads_n + 0.8), sharex=True)
    axes = np.atleast_1d(axes)
    for lead, ax in enumerate(axes):
        _shade_masked(ax, mask[lead], patch, fs)
        ax.plot(time, x[lead], color="black", lw=0.6, label="input")
        if recon is not None:
            # only masked patches: the visible ones are not part of the objective
            r = np.where(np.repeat(mask[lead], patch), recon[lead].reshape(-1), np.nan)
            ax.plot(time, r, color="tab:red", lw=0.7, label="reconstruction (masked)")
        ax.set_ylabel(leads[lead] if lead < len(leads) else str(lead), rotation=0, ha="right", va="center")
        ax.tick_params(labelsize=6)
        ax.margins(x=0)
    axes[-1].set_xlabel("time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=7, ncol=2)
    fig.suptitle(title or "input (black), masked patches (grey), reconstruction (red)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, path)


def plot_latent_reconstruction(
    x: np.ndarray,
    target: np.ndarray,
    pred: np.ndarray,
    mask: np.ndarray,
    path: str | Path,
    fs: float = 250.0,
    title: str = "",
    lead: int = 1,
    leads: Sequence[str] = CANONICAL_LEADS,
) -> Path:
    """Level 1: the level-0 input with masked latent-token positions shaded, and for one lead the
    target and reconstructed latent tokens as heatmaps (token position x channel).

    x (12, T) input window; target, pred (12, N, W) latent tokens (normalised units when
    norm_target); mask (12, N) bool True = masked token.
    """
    plt = _plt()
    leads_n, t = x.shape
    n, width = target.shape[1], target.shape[2]
    patch = t // n
    fig = plt.figure(figsize=(14, 9))
    grid = fig.add_gridspec(3 + leads_n // 4, 2, height_ratios=[1] * (leads_n // 4) + [1.4, 1.4, 1.4])
    time = np.arange(t) / fs
    for k, row in enumerate(range(0, leads_n, 4)):  # 3 rows of 4 leads overlaid with offsets
        ax = fig.add_subplot(grid[k, :])
        for j, l in enumerate(range(row, min(row + 4, leads_n))):
            ax.plot(time + j * t / fs, x[l], color="black", lw=0.5)
            _shade_masked(ax, mask[l], patch, fs, offset=j * t)
            ax.text((j * t + 5) / fs, np.nanmax(x[l]) if np.isfinite(x[l]).any() else 0, leads[l], fontsize=7)
        ax.set_yticks([])
        ax.tick_params(labelsize=6)
        ax.margins(x=0)
    lo, hi = np.percentile(np.concatenate([target[lead].ravel(), pred[lead].ravel()]), [1, 99])
    for col, (name, data) in enumerate((("target tokens", target[lead]), ("reconstruction", pred[lead]))):
        ax = fig.add_subplot(grid[leads_n // 4 :, col])
        image = ax.imshow(data.T, aspect="auto", cmap="coolwarm", vmin=lo, vmax=hi, interpolation="nearest")
        for j in np.flatnonzero(~mask[lead]):  # visible tokens are not reconstructed by the objective: fade them
            ax.axvspan(j - 0.5, j + 0.5, color="white", alpha=0.65, lw=0)
        ax.set_title(f"lead {leads[lead]}: {name} ({n} positions x {width} channels; faded = visible)", fontsize=8)
        ax.set_xlabel("token position")
        ax.set_ylabel("channel")
        fig.colorbar(image, ax=ax, fraction=0.03)
    fig.suptitle(title or "level 1: masked latent tokens (grey = masked positions)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def plot_training_step(
    level: int, x: np.ndarray, arrays: dict[str, np.ndarray], folder: Path, step: int, fs: float, title: str
) -> Path:
    """The reconstruction figure of one training step, `folder/{recon,latent}-step-NNNNNNN.png`.

    x (12, T) input window; arrays["mask"] (12, N) bool; level 0 also arrays["recon"] (12, N, P) in
    the input's units, level 1 arrays["target"] and arrays["pred"] (12, N, W) latent tokens.
    """
    if level == 0:
        note = "(input black, masked grey, reconstruction red)"
        path = folder / f"recon-step-{step:07d}.png"
        return plot_reconstruction(x, arrays["recon"], arrays["mask"], path, fs, f"level 0 {title} {note}")
    path = folder / f"latent-step-{step:07d}.png"
    return plot_latent_reconstruction(x, arrays["target"], arrays["pred"], arrays["mask"], path, fs, f"level 1 {title}")


def read_metrics(path: str | Path) -> list[dict]:
    """Records of a metrics.jsonl file (unreadable lines skipped: a crash may cut the last one)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def plot_training_curves(metrics_path: str | Path, path: str | Path, title: str = "") -> Path:
    """Loss (log scale), learning rate and grad norm against step, from metrics.jsonl."""
    plt = _plt()
    every = read_metrics(metrics_path)
    records = [r for r in every if "loss" in r]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.5))
    steps = [r["step"] for r in records]
    for key in ("loss", "recon_loss", "pp_loss", "val_loss"):
        points = [(r["step"], r[key]) for r in every if r.get(key) is not None]
        if points:
            axes[0].plot(*zip(*points), label=key, lw=0.9, marker="o" if key == "val_loss" else None, ms=3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=7)
    axes[0].set_title("loss")
    axes[1].plot(steps, [r.get("lr") for r in records], lw=0.9)
    axes[1].set_title("learning rate")
    axes[2].plot(steps, [r.get("grad_norm") for r in records], lw=0.9)
    axes[2].set_title("grad norm (before clipping)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.tick_params(labelsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    plt = _plt()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, suffix=".png") as tmp:  # a viewer never sees half a PNG
        fig.savefig(tmp, dpi=90)
    plt.close(fig)
    return path
