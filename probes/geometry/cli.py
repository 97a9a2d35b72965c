"""`ecgpos geometry`: the preprint's representation dynamics between consecutive levels of a nested encoder.

    ecgpos geometry --encoder NESTED_RUN_OR_EXPORT --task TASK --data-root DIR [--splits DIR]
                    --nominal A,B[,...] --anomalous C[,...] [--split test] [--out DIR]
                    [--space features|reconstruction] [--level L]

TASK and the data layout are the probe's. A record belongs to a class when it carries exactly one of
the chosen labels (nominal or anomalous); records with none or several are left out and counted.
Each nominal class needs at least two records with different features (its radius divides S and rho).
Every consecutive pair of levels (l-1, l) of an L-level encoder is measured (--level l: that pair only);
x = level l-1, x_hat = the same records one level deeper:
  --space features (default): x = level l-1's features, x_hat = level l's features, both from
    forward_features (what the probes see); these are two coordinate systems, standardised with the
    level-(l-1) map all the same, so a Delta mixes carving with the change of coordinates;
  --space reconstruction: the appendix's own reading: x = level l-1's patch tokens in level l's
    target space, x_hat = their level-l reconstruction with every token visible; both averaged over
    the patch tokens alike (the appendix's latent is one vector per sample; a record's is here the
    mean of its tokens, not their 360 x W concatenation). Needs level l's decoder: a run folder or
    an export --with-decoders.
Also reports the carving criterion of every level with a decoder (ecgpos.objectives.criterion): the
fraction of held-out nominal records (those of the chosen split) whose perturbed input's reconstruction
still violates the Push margin, alpha d(x~, x) > d(x^, x~) (a record's windows averaged, then records
weighted equally), with the level's push-pull perturbation (its defaults when it trained without).
Writes OUT/metrics.csv (level, metric, x, x_hat, delta_pct; level = the deeper level l), OUT/features.npz
(x, x_hat of the deepest pair; x_level<l> per level; violation_level<l> per level), OUT/summary.md,
OUT/geometry.png (the deepest pair) and OUT/depth.png (each metric's Delta % against depth), replacing
an earlier geometry's; an --out holding other files (a probe's results, notes) is refused in one line.
"""

from __future__ import annotations

import argparse
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
from ecgpos.models.nested import parse_level_name
from ecgpos.probes.geometry.dynamics import UnmeasurableError, check_classes, geometry, plot_geometry
from ecgpos.probes.geometry.report import GeometryRun, plot_depth, summary_markdown, write_metrics
from ecgpos.probes.shared.datasets import prepared_record, task_locator
from ecgpos.probes.shared.out_folder import GEOMETRY_FILES, check_out_folder
from ecgpos.probes.shared.task_data import RecordSettings, record_column, task_windows
from ecgpos.probes.shared.tasks import SPLITS, read_split, resolve_task

SPACES = ("features", "reconstruction")
NOT_FOUND = "not found under the data root"


OUTPUT_FILES = GEOMETRY_FILES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos geometry", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--encoder", required=True, help="nested (level-1) run folder or export folder")
    p.add_argument(
        "--task", required=True, help="ptbxl-super, ptbxl-sub, ptbxl-form, ptbxl-rhythm, cpsc2018, csn or custom:<dir>"
    )
    p.add_argument("--data-root", type=user_path, default=Path("."), help="folder holding ptbxl/ and cpsc2018/")
    p.add_argument("--splits", type=user_path, help="folder holding MERL's split folders")
    p.add_argument("--nominal", required=True, help="comma-separated nominal classes (at least two)")
    p.add_argument("--anomalous", required=True, help="comma-separated anomalous classes")
    p.add_argument("--split", default="test", help="train, val, test, a comma-separated list, or all (default test)")
    p.add_argument("--level", type=int, help="compare levels LEVEL-1 and LEVEL only (default: every consecutive pair)")
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
    column = record_column(task, RecordSettings())
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
    """What the command runs: the encoder (all its levels), the pairs (l-1, l) it compares, and the
    objective (decoder) of every level the folder provides."""

    encoder: nn.Module
    pairs: list[int]  # the deeper level l of each pair (l-1, l)
    objectives: dict[int, nn.Module]
    spec: object
    note: str = ""
    unfinished: str | None = None  # a run folder still before its last step: which checkpoint is used


def load_levels(path: str, level: int | None = None) -> Levels:
    """A nested run or export; every level's objective (decoder) the folder provides. `level` l
    compares levels l-1 and l only; without it every consecutive pair."""
    from ecgpos.export.decoders import NoDecoders
    from ecgpos.inference.resolve import resolve_encoder, unfinished_note
    from ecgpos.inference.scoring import load_recon_models
    from ecgpos.models.factory import depth_of

    loaded = resolve_encoder(path)
    module = loaded.encoder
    depth = depth_of(module)
    if depth < 2:
        raise EcgposError(f"{path} is a level-0 encoder: geometry compares two levels and needs a nested run or export")
    if level is not None and not 1 <= level < depth:
        raise EcgposError(f"--level {level}: {path} has levels 0..{depth - 1}; geometry compares l-1 and l for l >= 1")
    objectives, note = {}, ""
    try:
        recon = load_recon_models(path)
        objectives = {parse_level_name(name): m for name, m in recon.levels.items()}
        note = "; ".join(n for n in recon.notes if n)
    except NoDecoders as err:  # damaged or foreign decoders are refused, not taken for absent ones
        note = str(err)
    pairs = [level] if level is not None else list(range(1, depth))
    return Levels(module.eval(), pairs, objectives, loaded.spec, note, unfinished_note(loaded.info))


@torch.no_grad()
def _level_outputs(levels: Levels, w: torch.Tensor, space: str) -> dict[str, np.ndarray]:
    """Per window: the features of every level a pair needs (features space), or each pair's x and
    x_hat (reconstruction space: level l's target tokens and their reconstruction, token-averaged)."""
    from ecgpos.models.factory import cut_encoder

    out = {}
    for level in levels.pairs:
        if space == "features":
            for k in (level - 1, level):
                if f"f{k}" not in out:
                    out[f"f{k}"] = cut_encoder(levels.encoder, k).forward_features(w).float().cpu().numpy()
        else:
            model = levels.objectives[level]
            tokens = model.level_inputs(w)
            out[f"x{level}"] = model.target(tokens).mean(dim=(1, 2)).float().cpu().numpy()
            out[f"h{level}"] = model.reconstruct(tokens).float().mean(dim=(1, 2)).cpu().numpy()
    return out


def record_name(key: str) -> str:
    """The record id the criterion's perturbation is keyed by: the record's file name without extension,
    which is the record id `ecgpos preprocess` gives it in shards (so a record gets the same perturbation
    in training's validation, in `carve` and here)."""
    name = Path(key).name
    return name.removesuffix(".hea") if name.endswith(".hea") else name


@dataclass
class Extracted:
    keys: list[str]
    labels: list[str]
    pairs: dict[int, tuple[np.ndarray, np.ndarray]]  # deeper level l -> (x, x_hat), one row per record
    violation: dict[int, dict[str, float]]  # level -> nominal record key -> fraction of its windows violating
    failed: Counter


def extract(
    levels: Levels, sel: Selection, located: tuple, nominal: Sequence[str], space: str, device: str, batch_size: int
) -> Extracted:
    """Each pair's x, x_hat (mean over each record's windows) and every level's push-margin violations
    of the nominal records (ecgpos.objectives.criterion, each window perturbed from its own seed)."""
    from ecgpos.objectives.criterion import window_violations

    task, locator = located
    spec, windows = levels.spec, task_windows(RecordSettings(), task.dataset)
    levels.encoder.to(device)
    for model in levels.objectives.values():
        model.to(device)
    keys, labels, rows, violation, failed = [], [], [], {k: {} for k in levels.objectives}, Counter()

    def records() -> Iterator[tuple[tuple[str, str], np.ndarray]]:
        for key, label in zip(sel.keys, sel.labels):
            try:
                x = prepared_record(*locator.locate(key), spec)
                found = record_windows(pad_to(x, spec.window), spec.window, windows)
            except EcgposError as err:
                failed[getattr(err, "reason", "unreadable")] += 1
                continue
            if label in nominal:  # the criterion: the record's windows named (key, window number)
                w = torch.from_numpy(found).float().to(device)
                names = [(record_name(key), k) for k in range(len(found))]
                for level, model in levels.objectives.items():
                    violation[level][key] = float(window_violations(model, w, names).float().mean())
            yield (key, label), found

    def outputs(windows: np.ndarray) -> dict[str, np.ndarray]:
        return _level_outputs(levels, torch.from_numpy(windows).float().to(device), space)

    for (key, label), means in record_means(records(), outputs, batch_size):
        keys.append(key)
        labels.append(label)
        rows.append(means)
    pairs = {}
    for level in levels.pairs:
        a, b = (f"f{level - 1}", f"f{level}") if space == "features" else (f"x{level}", f"h{level}")
        width = rows[0][a].shape[0] if rows else 0
        pairs[level] = tuple(np.array([r[k] for r in rows]).reshape(-1, width) for k in (a, b))
    return Extracted(keys, labels, pairs, violation, failed)


def carving_lines(levels: Levels, violation: dict[int, dict[str, float]]) -> list[str]:
    """The carving criterion of every level with a decoder, as summary.md states it."""
    from ecgpos.objectives.criterion import criterion, criterion_settings

    if not violation:
        return [
            "Carving criterion: not available, the encoder has no decoders "
            f"({levels.note or 'export it with --with-decoders'})."
        ]
    lines = [
        "Carving criterion per level: the fraction of the held-out nominal records whose perturbed input's "
        "reconstruction at that level still violates the Push margin alpha d(x~, x) > d(x^, x~) (each record's "
        'windows averaged, records weighted equally; configs/README.md, "The carving criterion"). Lower means '
        "the level already pushes reconstructions of perturbed nominal inputs away from the perturbation; a high "
        "fraction suggests the range needs further carving (to choose the depth by it, measure it on val or train, "
        "not test).",
        "",
        "| level | criterion | records | perturbation | scale | alpha | push-pull |",
        "|---|---|---|---|---|---|---|",
    ]
    for level, per_record in sorted(violation.items()):
        model = levels.objectives[level]
        pp = criterion_settings(model)
        trained = "trained" if model.push_pull.enabled else "off (defaults)"
        lines.append(
            f"| {level} | {criterion(per_record):.3f} | {len(per_record)} | {pp.perturbation} | {pp.scale:g} | "
            f"{pp.alpha:g} | {trained} |"
        )
    missing = sorted(set(range(max(levels.pairs) + 1)) - set(violation))
    if missing:
        lines += ["", f"No criterion for level(s) {', '.join(map(str, missing))}: {levels.note or 'no decoder'}."]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    measure(sys.argv[1:] if argv is None else argv)
    return 0


def measure(argv: Sequence[str]) -> GeometryRun:
    """`ecgpos geometry ARGV` called from Python: the same checks, outputs and errors (EcgposError), and
    the metrics returned. The options stay command-line words: carve passes a user's own geometry options
    (`carve --geometry-args`) through unchanged."""
    args = build_parser().parse_args(list(argv))
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
    check_out_folder(args.out, "geometry", OUTPUT_FILES)  # an earlier geometry's files are replaced whole
    device = str(resolve_device(args.device))
    sel, located = select_records(args.task, args.splits, args.data_root, _splits(args.split), nominal, anomalous)
    problem = check_classes(np.array(sel.labels, dtype=str), nominal, anomalous)
    if problem:  # with what was left out: a wrong --data-root shows as every record not found
        named = {NOT_FOUND: f"not found under --data-root {args.data_root}"}
        left_out = "; ".join(f"{v} {named.get(k, k)}" for k, v in sel.excluded.items())
        raise EcgposError(f"{args.task} ({args.split}): {problem}" + (f" (left out: {left_out})" if left_out else ""))
    levels = load_levels(args.encoder, args.level)
    if levels.unfinished:
        print(f"ecgpos geometry: warning: {levels.unfinished}", file=sys.stderr)
    if args.space == "reconstruction":
        lacking = [level for level in levels.pairs if level not in levels.objectives]
        if lacking:
            raise EcgposError(
                f"--space reconstruction needs the decoder of level(s) {', '.join(map(str, lacking))}: {levels.note}"
            )
    data = extract(levels, sel, located, nominal, args.space, device, args.batch_size)
    problem = check_classes(np.array(data.labels, dtype=str), nominal, anomalous)
    if problem:
        raise EcgposError(f"{args.task} ({args.split}) after skipped records: {problem}")
    results = {}
    for level, (x, x_hat) in data.pairs.items():
        try:  # before anything is written: NaN or flat features make every metric meaningless
            results[level] = geometry(
                x, x_hat, data.labels, nominal, anomalous, (f"level {level - 1}", f"level {level}")
            )
        except UnmeasurableError as err:
            raise EcgposError(f"{args.encoder} (levels {level - 1} -> {level}): {err}") from None
    present = [c for c in nominal if c in data.labels]
    make_output_folder(args.out)
    remove_abandoned_temporaries(args.out)  # what a killed run on this host left
    for name in OUTPUT_FILES:  # an interrupted write then never leaves this run's files beside an earlier one's
        (args.out / name).unlink(missing_ok=True)
    write_metrics(args.out / "metrics.csv", results)
    top = max(results)
    arrays = {"x": data.pairs[top][0], "x_hat": data.pairs[top][1]}
    arrays.update({f"x_level{level}": pair[1] for level, pair in data.pairs.items()})
    arrays.update({f"x_level{level - 1}": pair[0] for level, pair in data.pairs.items() if args.space == "features"})
    arrays.update(
        {
            f"violation_level{level}": np.array([v.get(k, np.nan) for k in data.keys])
            for level, v in data.violation.items()
        }
    )
    with atomic_path(args.out / "features.npz", suffix=".npz") as tmp:
        np.savez(tmp, labels=np.array(data.labels, dtype=str), record_ids=np.array(data.keys, dtype=str), **arrays)
    text = summary_markdown(args, results, data, sel, carving_lines(levels, data.violation), present)
    if levels.unfinished:
        text += f"\nWarning: {levels.unfinished}.\n"
    atomic_write_text(args.out / "summary.md", text, sync=False)
    titles = (f"x: level {top - 1} ({args.space})", f"x_hat: level {top} ({args.space})")
    plot_geometry(results[top], data.labels, present, args.out / "geometry.png", titles)
    plot_depth(results, args.out / "depth.png")
    print(text, end="")
    print(f"wrote {', '.join(str(args.out / f) for f in OUTPUT_FILES)}")
    return GeometryRun(args.out, results)
