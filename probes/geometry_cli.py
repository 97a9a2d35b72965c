"""`ecgpos geometry`: the preprint's representation dynamics between two levels of a nested encoder.

    ecgpos geometry --encoder NESTED_RUN_OR_EXPORT --task TASK --data-root DIR [--splits DIR]
                    --nominal A,B[,...] --anomalous C[,...] [--split test] [--out DIR]
                    [--space features|reconstruction]

TASK and the data layout are the probe's. A record belongs to a class when it carries exactly one of
the chosen labels (nominal or anomalous); records with none or several are left out and counted.
Each nominal class needs at least two records with different features (its radius divides S and rho).
x = Stage-0 level, x_hat = the same records one level deeper:
  --space features (default): x = Stage-0 features, x_hat = nested (Stage-1) features, both from
    forward_features (what the probes see); these are two coordinate systems, standardised with the
    Stage-0 map all the same, so a Delta mixes carving with the change of coordinates;
  --space reconstruction: the appendix's own reading: x = the Stage-0 latent patch tokens in Stage 1's
    target space, x_hat = their Stage-1 reconstruction with every token visible; both averaged over
    the patch tokens alike (the appendix's latent is one vector per sample; a record's is here the
    mean of its tokens, not their 360 x W concatenation). Needs the Stage-1 decoder: a Stage-1 run or
    an export --with-decoders.
Also reports the carving criterion: the fraction of perturbed Stage-1 inputs of held-out nominal
records (those of the chosen split) that still violate the Push margin, alpha d(x~, x) > d(x^, x~)
(a record's windows averaged, then records weighted equally), with the run's push-pull perturbation
(its defaults when the run trained without push-pull).
Writes OUT/metrics.csv, OUT/features.npz, OUT/summary.md, OUT/geometry.png.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ecgpos.ecg.signal import pad_to
from ecgpos.errors import EcgposError
from ecgpos.files import (
    atomic_path,
    atomic_write_text,
    make_output_folder,
    remove_abandoned_temporaries,
    user_path,
)
from ecgpos.inference.resolve import refuse_model_folder
from ecgpos.models.features import record_means, record_windows, resolve_device
from probes.datasets import prepared_record, task_locator
from probes.geometry import GeometryResult, UnmeasurableError, check_classes, geometry, plot_geometry
from probes.run import ProbeConfig, record_column, task_windows
from probes.tasks import SPLITS, read_split, resolve_task

SPACES = ("features", "reconstruction")
# what x and x_hat are in each space, in summary.md: the appendix defines its metrics on the reconstruction
SPACE_TEXT = {
    "features": "x = the Stage-0 encoder's features, x_hat = the nested (Stage-1) encoder's features, as the "
    "probes see them; the appendix's own x_hat, the Stage-1 reconstruction of the Stage-0 latent, is "
    "`--space reconstruction`",
    "reconstruction": "x = the Stage-0 latent patch tokens in Stage 1's target space, x_hat = their Stage-1 "
    "reconstruction (the appendix's reading), both averaged over the patch tokens",
}
CARVING_SEED = 0
NOT_FOUND = "not found under the data root"


OUTPUT_FILES = ("metrics.csv", "features.npz", "summary.md", "geometry.png")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos geometry", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--encoder", required=True, help="nested (Stage-1) run folder or export folder")
    p.add_argument(
        "--task", required=True, help="ptbxl-super, ptbxl-sub, ptbxl-form, ptbxl-rhythm, cpsc2018, csn or custom:<dir>"
    )
    p.add_argument("--data-root", type=user_path, default=Path("."), help="folder holding ptbxl/ and cpsc2018/")
    p.add_argument("--splits", type=user_path, help="folder holding MERL's split folders")
    p.add_argument("--nominal", required=True, help="comma-separated nominal classes (at least two)")
    p.add_argument("--anomalous", required=True, help="comma-separated anomalous classes")
    p.add_argument("--split", default="test", help="train, val, test, a comma-separated list, or all (default test)")
    p.add_argument("--space", choices=SPACES, default="features", help="which x / x_hat pair (default features)")
    p.add_argument("--out", type=user_path, default=Path("geometry"), help="output folder (default ./geometry)")
    p.add_argument("--device", default="auto", help="torch device (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=32, help="windows per forward pass (default 32)")
    return p


def _names(text: str) -> list[str]:
    return list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))


def _splits(text: str) -> list[str]:
    names = list(SPLITS) if text == "all" else _names(text)
    bad = [n for n in names if n not in SPLITS]
    if bad or not names:
        raise EcgposError(f"--split must be train, val, test, a comma-separated list of them, or all; got {text!r}")
    return names


@dataclass
class Selection:
    """The records of the chosen classes and what was left out."""

    keys: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    excluded: Counter = field(default_factory=Counter)  # reason -> count


def select_records(
    task_name: str,
    splits_root: Path | None,
    data_root: Path,
    splits: Sequence[str],
    nominal: Sequence[str],
    anomalous: Sequence[str],
) -> tuple[Selection, object]:
    """Records carrying exactly one chosen label, located under the data root; (selection, locator)."""
    task = resolve_task(task_name)
    chosen = list(nominal) + list(anomalous)
    unknown = [c for c in chosen if c not in task.classes]
    if unknown:
        raise EcgposError(f"task {task.name} has no class {', '.join(unknown)} (classes: {' '.join(task.classes)})")
    if set(nominal) & set(anomalous):
        raise EcgposError(f"classes both nominal and anomalous: {', '.join(sorted(set(nominal) & set(anomalous)))}")
    locator = task_locator(task, data_root)
    column = record_column(task, ProbeConfig())
    sel, seen = Selection(), set()
    cols = [task.classes.index(c) for c in chosen]
    for split in splits:
        table = read_split(task, splits_root, split, column)
        for key, row in zip(table.records, table.labels[:, cols]):
            found = locator.locate(key)
            # a record listed in several splits (or as `r` and `r.hea`, or through a link) counts once
            record = os.path.realpath(found[0]) if found else key
            if record in seen:
                continue
            seen.add(record)
            if row.sum() != 1:
                sel.excluded["none of the chosen labels" if row.sum() == 0 else "several chosen labels"] += 1
            elif found is None:
                sel.excluded[NOT_FOUND] += 1
            else:
                sel.keys.append(key)
                sel.labels.append(chosen[int(np.argmax(row))])
    return sel, (task, locator)


@dataclass
class Levels:
    """What the command runs: the Stage-0 and nested encoders, and the Stage-1 objective if present."""

    stage0: nn.Module
    nested: nn.Module
    stage1: nn.Module | None
    spec: object
    note: str = ""
    unfinished: str | None = None  # a run folder still before its last step: which checkpoint is used


def load_levels(path: str) -> Levels:
    """A nested run or export; the Stage-1 objective (decoder) when the folder provides one."""
    from ecgpos.export.decoders import NoDecoders
    from ecgpos.inference.resolve import resolve_encoder, unfinished_note
    from ecgpos.inference.scoring import load_recon_models

    loaded = resolve_encoder(path)
    module = getattr(loaded.module, "encoder", loaded.module)  # an export wraps its encoder
    if not hasattr(module, "stage1"):
        raise EcgposError(
            f"{path} is a Stage-0 encoder: geometry compares two levels and needs a nested (Stage-1) run or export"
        )
    stage1, note = None, ""
    try:
        stage1 = load_recon_models(path).levels.get("stage1")
    except NoDecoders as err:  # damaged or foreign decoders are refused, not taken for absent ones
        note = str(err)
    if stage1 is not None:
        module = stage1.nested_encoder()
    return Levels(module.stage0.eval(), module.eval(), stage1, loaded.spec, note, unfinished_note(loaded.info))


@torch.no_grad()
def _level_pair(levels: Levels, w: torch.Tensor, space: str) -> tuple[torch.Tensor, torch.Tensor]:
    if space == "features":
        return levels.stage0.forward_features(w), levels.nested.forward_features(w)
    model = levels.stage1
    tokens = model.latent_tokens(w)
    return model.target(tokens).mean(dim=(1, 2)), model.reconstruct(tokens).float().mean(dim=(1, 2))


@dataclass
class Extracted:
    keys: list[str]
    labels: list[str]
    x: np.ndarray
    x_hat: np.ndarray
    violation: dict[str, float]  # record key -> fraction of its windows violating the push margin
    failed: Counter


def extract(
    levels: Levels, sel: Selection, located: tuple, nominal: Sequence[str], space: str, device: str, batch_size: int
) -> Extracted:
    """x, x_hat (mean over each record's windows) and the nominal records' push-margin violations."""
    task, locator = located
    spec, windows = levels.spec, task_windows(ProbeConfig(), task.dataset)
    for module in (levels.nested, levels.stage1):
        if module is not None:
            module.to(device)
    generator = torch.Generator().manual_seed(CARVING_SEED)
    keys, labels, xs, xhs, violation, failed = [], [], [], [], {}, Counter()

    def outputs(windows: np.ndarray) -> dict[str, np.ndarray]:
        w = torch.from_numpy(windows).float().to(device)
        x, x_hat = (v.float().cpu().numpy() for v in _level_pair(levels, w, space))
        out = {"x": x, "x_hat": x_hat}
        if levels.stage1 is not None:
            out["violation"] = levels.stage1.push_violations(w, generator, per_sample_noise=True).float().cpu().numpy()
        return out

    def records() -> Iterator[tuple[tuple[str, str], np.ndarray]]:
        for key, label in zip(sel.keys, sel.labels):
            try:
                x = prepared_record(*locator.locate(key), spec)
                found = record_windows(pad_to(x, spec.window), spec.window, windows)
            except EcgposError as err:
                failed[getattr(err, "reason", "unreadable")] += 1
                continue
            yield (key, label), found

    for (key, label), means in record_means(records(), outputs, batch_size):
        keys.append(key)
        labels.append(label)
        xs.append(means["x"])
        xhs.append(means["x_hat"])
        if "violation" in means and label in nominal:
            violation[key] = float(means["violation"])
    width = xs[0].shape[0] if xs else 0
    return Extracted(keys, labels, np.array(xs).reshape(-1, width), np.array(xhs).reshape(-1, width), violation, failed)


def carving_line(levels: Levels, violation: dict[str, float]) -> str:
    if levels.stage1 is None:
        return (
            "Carving criterion: not available, the encoder has no Stage-1 decoder "
            f"({levels.note or 'export it with --with-decoders'})."
        )
    pp = levels.stage1.push_pull
    which = "the run's push-pull settings" if pp.enabled else "the default push-pull settings (the run trained without)"
    from ecgpos.objectives.push_pull import PushPullConfig

    used = pp if pp.enabled else PushPullConfig()
    return (
        f"Carving criterion (Stage-1 level): a fraction {np.mean(list(violation.values())):.3f} of the perturbed "
        f"inputs of {len(violation)} held-out nominal records (each record's windows averaged, records weighted "
        "equally) violate the Push margin alpha d(x~, x) > d(x^, x~) "
        f"({which}: {used.perturbation} perturbation, scale {used.scale}, alpha {used.alpha}). "
        "Lower means the level already pushes reconstructions of perturbed nominal inputs away from the "
        "perturbation; a high fraction suggests the range needs further carving (to choose the depth by it, "
        "measure it on val or train, not test)."
    )


def summary_markdown(
    args: argparse.Namespace, res: GeometryResult, data: Extracted, sel: Selection, carving: str, nominal: Sequence[str]
) -> str:
    counts = Counter(data.labels)
    excluded = sel.excluded + Counter({f"skipped ({k})": v for k, v in data.failed.items()})
    lines = [
        f"# PoS representation dynamics: {args.encoder}",
        "",
        f"Task {args.task}, split(s) {args.split}, space `{args.space}`: {SPACE_TEXT[args.space]}. Both levels "
        "are standardised with the mean and population std (+1e-8) of the nominal records' x.",
        "Records: "
        + ", ".join(f"{c} {counts.get(c, 0)}" for c in [*nominal, *args.anomalous_list])
        + (f"; excluded: {', '.join(f'{v} {k}' for k, v in excluded.items())}" if excluded else "")
        + ".",
        "",
        "D_inter, R, d_samp and d_pool are Euclidean distances in the standardised space (each dimension in "
        "units of the nominal x std); S, rho and IC are ratios of them; Delta % is 100 (x_hat - x) / x.",
        "",
        "| metric | x | x_hat | Delta % |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['metric']} | {r['x']:.4g} | {r['x_hat']:.4g} | {r['delta_pct']:+.2f} |" for r in res.rows()]
    preds = res.predictions()
    lines += [
        "",
        f"PoS predictions ({sum(p[3] for p in preds)} of {len(preds)} hold here):",
        "",
        "| prediction | Delta % | holds |",
        "|---|---|---|",
    ]
    lines += [f"| {text} | {delta:+.2f} | {'yes' if holds else 'no'} |" for _, text, delta, holds in preds]
    return "\n".join(lines + ["", carving, ""])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    nominal, anomalous = _names(args.nominal), _names(args.anomalous)
    args.anomalous_list = anomalous
    if len(nominal) < 2:
        raise EcgposError(
            f"--nominal needs at least two classes (the separation terms need pairs), got {args.nominal!r}"
        )
    if not anomalous:
        raise EcgposError("--anomalous needs at least one class")
    if args.batch_size < 1:
        raise EcgposError(f"--batch-size must be at least 1, got {args.batch_size}")
    for flag, folder in (("--data-root", args.data_root), ("--splits", args.splits)):
        if folder is not None and not folder.is_dir():  # as `ecgpos probe`: also where a custom task needs neither
            raise EcgposError(f"{flag} {folder} is not a folder")
    make_output_folder(args.out, create=False)  # a file as --out: one line now, not after the work
    refuse_model_folder(args.out)
    device = str(resolve_device(args.device))
    sel, located = select_records(args.task, args.splits, args.data_root, _splits(args.split), nominal, anomalous)
    problem = check_classes(np.array(sel.labels, dtype=str), nominal, anomalous)
    if problem:  # with what was left out: a wrong --data-root shows as every record not found
        named = {NOT_FOUND: f"not found under --data-root {args.data_root}"}
        left_out = "; ".join(f"{v} {named.get(k, k)}" for k, v in sel.excluded.items())
        raise EcgposError(f"{args.task} ({args.split}): {problem}" + (f" (left out: {left_out})" if left_out else ""))
    levels = load_levels(args.encoder)
    if levels.unfinished:
        print(f"ecgpos geometry: warning: {levels.unfinished}", file=sys.stderr)
    if args.space == "reconstruction" and levels.stage1 is None:
        raise EcgposError(f"--space reconstruction needs the Stage-1 decoder: {levels.note}")
    data = extract(levels, sel, located, nominal, args.space, device, args.batch_size)
    problem = check_classes(np.array(data.labels, dtype=str), nominal, anomalous)
    if problem:
        raise EcgposError(f"{args.task} ({args.split}) after skipped records: {problem}")
    try:  # before anything is written: NaN or flat features make every metric meaningless
        res = geometry(data.x, data.x_hat, data.labels, nominal, anomalous, ("Stage-0", "Stage-1"))
    except UnmeasurableError as err:
        raise EcgposError(f"{args.encoder}: {err}") from None
    present = [c for c in nominal if c in data.labels]
    make_output_folder(args.out)
    remove_abandoned_temporaries(args.out)  # what a killed run on this host left
    for name in OUTPUT_FILES:  # an interrupted write then never leaves this run's files beside an earlier one's
        (args.out / name).unlink(missing_ok=True)
    with atomic_path(args.out / "metrics.csv") as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["metric", "x", "x_hat", "delta_pct"])
        writer.writeheader()
        writer.writerows(res.rows())
    with atomic_path(args.out / "features.npz", suffix=".npz") as tmp:
        np.savez(
            tmp,
            x=data.x,
            x_hat=data.x_hat,
            labels=np.array(data.labels, dtype=str),
            record_ids=np.array(data.keys, dtype=str),
        )
    text = summary_markdown(args, res, data, sel, carving_line(levels, data.violation), present)
    if levels.unfinished:
        text += f"\nWarning: {levels.unfinished}.\n"
    atomic_write_text(args.out / "summary.md", text, sync=False)
    plot_geometry(
        res,
        data.labels,
        present,
        args.out / "geometry.png",
        (f"x: Stage 0 ({args.space})", f"x_hat: Stage 1 ({args.space})"),
    )
    print(text, end="")
    print(f"wrote {', '.join(str(args.out / f) for f in OUTPUT_FILES)}")
    return 0
