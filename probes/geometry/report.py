"""What `ecgpos geometry` writes for an encoder of any depth: metrics.csv (one block of rows per pair of
levels, its `level` the deeper one), summary.md (each pair's metrics and PoS predictions, then the
carving criterion per level) and depth.png (each metric's Delta % against depth)."""

from __future__ import annotations

import argparse
import csv
import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from ecgpos.files import atomic_path
from ecgpos.probes.geometry.dynamics import METRICS, PREDICTIONS, GeometryResult

# what x and x_hat are in each space, in summary.md: the appendix defines its metrics on the reconstruction
SPACE_TEXT = {
    "features": "x = level l-1's features, x_hat = level l's features (the nested encoder read at level l), as "
    "the probes see them; the appendix's own x_hat, level l's reconstruction of the tokens below it, is "
    "`--space reconstruction`",
    "reconstruction": "x = the patch tokens of level l-1 in level l's target space, x_hat = their level-l "
    "reconstruction (the appendix's reading), both averaged over the patch tokens",
}


@dataclasses.dataclass(frozen=True)
class GeometryRun:
    """What one `ecgpos geometry` run returns to a caller in Python (carve): the folder it wrote and each
    pair's metrics by its deeper level l (what metrics.csv holds)."""

    out: Path
    results: dict[int, GeometryResult]

    def deltas(self, level: int) -> dict[str, float]:
        """Delta % of each metric between levels level-1 and level."""
        return {metric: float(value) for metric, value in self.results[level].delta_pct.items()}


def write_metrics(path: Path, results: dict[int, GeometryResult]) -> None:
    """metrics.csv: level (the deeper level l of the pair l-1, l), metric, x, x_hat, delta_pct."""
    with atomic_path(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["level", "metric", "x", "x_hat", "delta_pct"])
        writer.writeheader()
        for level, res in sorted(results.items()):
            writer.writerows({"level": level, **row} for row in res.rows())


def summary_markdown(
    args: argparse.Namespace,
    results: dict[int, GeometryResult],
    data: object,
    sel: object,
    carving: list[str],
    nominal: Sequence[str],
) -> str:
    """summary.md: the records, each pair's metrics and PoS predictions, and the criterion per level."""
    counts = Counter(data.labels)
    excluded = sel.excluded + Counter({f"skipped ({k})": v for k, v in data.failed.items()})
    lines = [
        f"# PoS representation dynamics: {args.encoder}",
        "",
        f"Task {args.task}, split(s) {args.split}, space `{args.space}`: {SPACE_TEXT[args.space]}. Both levels "
        "of a pair are standardised with the mean and population std (+1e-8) of the nominal records' x.",
        "Records: "
        + ", ".join(f"{c} {counts.get(c, 0)}" for c in [*nominal, *args.anomalous_list])
        + (f"; excluded: {', '.join(f'{v} {k}' for k, v in excluded.items())}" if excluded else "")
        + ".",
        "",
        "D_inter, R, d_samp and d_pool are Euclidean distances in the standardised space (each dimension in "
        "units of the nominal x std); S, rho and IC are ratios of them; Delta % is 100 (x_hat - x) / x.",
    ]
    for level, res in sorted(results.items()):
        lines += [
            "",
            f"## Levels {level - 1} -> {level}",
            "",
            "| metric | x | x_hat | Delta % |",
            "|---|---|---|---|",
        ]
        lines += [f"| {r['metric']} | {r['x']:.4g} | {r['x_hat']:.4g} | {r['delta_pct']:+.2f} |" for r in res.rows()]
        preds = res.predictions()
        lines += [
            "",
            f"PoS predictions at level {level} ({sum(p[3] for p in preds)} of {len(preds)} hold here):",
            "",
            "| prediction | Delta % | holds |",
            "|---|---|---|",
        ]
        lines += [f"| {text} | {delta:+.2f} | {'yes' if holds else 'no'} |" for _, text, delta, holds in preds]
    if len(results) > 1:
        lines += [
            "",
            "## PoS predictions through depth",
            "",
            "| prediction | " + " | ".join(f"level {level}" for level in sorted(results)) + " |",
            "|---|" + "---|" * len(results),
        ]
        for metric, (_, text) in PREDICTIONS.items():
            cells = []
            for level in sorted(results):
                holds = next(p[3] for p in results[level].predictions() if p[0] == metric)
                cells.append(f"{results[level].delta_pct[metric]:+.2f} ({'yes' if holds else 'no'})")
            lines.append(f"| {text} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", *carving, ""])


def plot_depth(results: dict[int, GeometryResult], path: Path) -> Path:
    """Each metric's Delta % (levels l-1 -> l) against the depth l, one panel per metric."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    depth = sorted(results)
    fig, axes = plt.subplots(1, len(METRICS), figsize=(2.3 * len(METRICS), 2.8), sharex=True)
    for ax, metric in zip(axes, METRICS):
        ax.plot(depth, [results[level].delta_pct[metric] for level in depth], marker="o")
        ax.axhline(0.0, color="grey", linewidth=0.8)
        sign = PREDICTIONS.get(metric, (0, ""))[0]
        ax.set_title(
            f"Delta {metric} %" + (" (PoS: > 0)" if sign > 0 else " (PoS: < 0)" if sign < 0 else ""), fontsize=8
        )
        ax.set_xticks(depth)
        ax.set_xlabel("level l (from l-1)", fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path
