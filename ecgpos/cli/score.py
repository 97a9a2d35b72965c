"""`ecgpos score --run RUN_OR_EXPORT --input RECORDS [--masks 8] [--out scores.csv] [--labels CSV ...]`.

Per-record reconstruction anomaly scores per level (see ecgpos.inference.scoring). RUN_OR_EXPORT is
a run folder of any level, or an export written with `--with-decoders`. RECORDS are read
exactly as `ecgpos embed` reads them: a WFDB record or folder, a shard folder or file, or a `.npy`
array with --fs and --leads; bad records are reported with their reason and skipped.
Writes --out (a .csv file) with columns record_id,level0_score,...,level<L-1>_score, one per level
that can reconstruct (a level-0 run has level-0 scores only; --level l keeps levels 0..l), and FILE's
`.skipped.csv` (record_id, reason, detail) as `embed` does; a record
longer than 300 s is scored on its centre 300 s, counted in the closing line and listed in FILE's
`.long.csv` (record_id, duration_s, used_from_s, used_to_s; written only when there is one).
With --labels CSV (record_id,label) and --nominal/--anomalous: the AUROC of anomalous vs nominal
per level (higher score = more anomalous), printed and written to FILE's `.summary.md` (scores.summary.md).
A label both nominal and anomalous, a listed label no row of CSV carries, a blank id or label, or a
record id listed twice with different labels is refused before any record is scored; labelled ids that
match no record and labelled records that were skipped are named (stderr and the summary), and a class
left with fewer than 2 scored records is refused.
With --calibration LABEL[,LABEL...] as well (held-out nominal records, D_fit; every level needed): the
preprint's OR rule over the levels' channels (ecgpos.inference.flags). Channel l fires when the level<l>
score is above t_l, every t_l at the one common percentile q* of D_fit whose OR-rule rate there is at most
--fpr (default 0.05). The summary gains q*, the thresholds, the realised rates on D_fit and on the nominal
records, and per nominal and anomalous label each channel's rate, the first level that fired and the
share first flagged below level 0 (the appendix's r_latent with two levels); FILE's `.flags.csv` gets
record_id,label, one 0/1 column per channel (level0, level1, ...), flag and
first_level for every scored record.
These files are replaced together: a run without --labels deletes an earlier run's FILE.summary.md,
a run without --calibration its FILE.flags.csv, a run without a record longer than 300 s its
FILE.long.csv, and a run that scored no record writes the skipped list and deletes the earlier
scores, long list, summary and flags.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from pathlib import Path

from ecgpos.ecg.screening import ScreenPolicy
from ecgpos.errors import EcgposError
from ecgpos.export.hub import model_ref
from ecgpos.files import atomic_paths, user_path
from ecgpos.inference.flags import check_fit_size, check_target, first_fired
from ecgpos.inference.inputs import open_source
from ecgpos.inference.labels import label_coverage
from ecgpos.inference.outputs import (
    check_writable,
    long_note,
    long_path,
    skipped_note,
    skipped_path,
    write_long_rows,
    write_skipped,
    write_skipped_rows,
    written_together,
)
from ecgpos.inference.scoring import (
    MAX_MASKS,
    FlagReport,
    ScoreResult,
    auroc_by_level,
    flags_by_label,
    load_recon_models,
    score_records,
)
from ecgpos.models.features import resolve_device
from ecgpos.models.nested import level_names

DEFAULT_FPR = 0.05


def summary_path(out: Path) -> Path:
    """Where the labelled AUROC summary of --out FILE goes: FILE's name with `.summary.md`, so runs
    written side by side into one folder each keep their own."""
    return out.with_name(f"{out.stem}.summary.md")


def flags_path(out: Path) -> Path:
    """Where the per-record OR-rule flags of --out FILE go: FILE's name with `.flags.csv`."""
    return out.with_name(f"{out.stem}.flags.csv")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos score", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--run", required=True, type=model_ref, help="run folder of any level, export with decoders or hf://ORG/NAME"
    )
    p.add_argument("--level", type=int, help="score levels 0..LEVEL only (default: every level)")
    p.add_argument("--input", required=True, type=user_path, help="WFDB record/folder, shard folder or .npy")
    p.add_argument(
        "--masks", type=int, default=8, help=f"fixed masks averaged per record (default 8, at most {MAX_MASKS})"
    )
    p.add_argument("--out", type=user_path, default=Path("scores.csv"), help="output .csv file (default scores.csv)")
    p.add_argument("--labels", type=user_path, help="CSV record_id,label (record_id as in scores.csv)")
    p.add_argument("--nominal", help="comma-separated nominal labels (with --labels)")
    p.add_argument("--anomalous", help="comma-separated anomalous labels (with --labels)")
    p.add_argument(
        "--calibration", help="comma-separated labels of held-out nominal records (D_fit) for the OR-rule flags"
    )
    p.add_argument(
        "--fpr", type=float, help=f"target OR-rule false-positive rate on D_fit, in (0, 1) (default {DEFAULT_FPR:g})"
    )
    p.add_argument("--fs", type=float, help="sampling rate of a .npy input (Hz)")
    p.add_argument("--leads", help="comma-separated lead names of a .npy input's rows")
    p.add_argument(
        "--num-windows",
        type=int,
        default=1,
        help="windows per record, averaged (default 1: centre; over the centre 300 s of a longer record)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="windows per forward pass (default 64)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument(
        "--keep-lead-mismatch",
        action="store_true",
        help="keep records whose limb leads break Einthoven's or Goldberger's relations (swapped, "
        "inverted or misnamed leads) instead of skipping them (lead_mismatch), as "
        "`ecgpos embed --keep-lead-mismatch` does",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _names(text: str | None, flag: str) -> list[str]:
    """The comma-separated names of `flag`, each once, in the order given."""
    names = list(dict.fromkeys(n.strip() for n in (text or "").split(",") if n.strip()))
    if not names:
        raise EcgposError(f"--labels needs {flag} A[,B...]")
    return names


def read_labels(path: Path) -> dict[str, str]:
    """record_id -> label from a CSV with those two columns (a spreadsheet's byte-order mark is read as
    none); a record id listed twice with two different labels, or a row with a blank id or label, is
    refused (the same label twice is one record)."""
    if path.is_dir():
        raise EcgposError(f"--labels {path} is a folder, not a CSV file")
    if not path.is_file():
        raise EcgposError(f"--labels {path} does not exist")
    try:
        with path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames or not {"record_id", "label"} <= set(reader.fieldnames):
                raise EcgposError(f"--labels {path}: needs columns record_id,label (found {reader.fieldnames})")
            labels: dict[str, str] = {}
            lines: dict[str, int] = {}  # the line of each record id's first row
            for row in reader:
                record_id, label = row["record_id"], row["label"]
                if not (record_id or "").strip() or not (label or "").strip():
                    blank = "record_id" if not (record_id or "").strip() else "label"
                    raise EcgposError(
                        f"--labels {path} line {reader.line_num}: blank {blank} ({record_id!r},{label!r})"
                    )
                if labels.get(record_id, label) != label:
                    raise EcgposError(
                        f"--labels {path}: record {record_id!r} is listed twice with different labels, "
                        f"{labels[record_id]!r} (line {lines[record_id]}) and {label!r} (line {reader.line_num})"
                    )
                labels[record_id] = label
                lines.setdefault(record_id, reader.line_num)
            return labels
    except (UnicodeDecodeError, csv.Error) as err:
        raise EcgposError(f"--labels {path} is not a readable CSV: {err}") from None


def check_label_names(path: Path, labels: dict[str, str], nominal: list[str], anomalous: list[str]) -> None:
    """Refuse, before any record is scored, a name both --nominal and --anomalous, and any listed
    name that no row of --labels carries (the AUROC would silently leave it out)."""
    both = sorted(set(nominal) & set(anomalous))
    if both:
        raise EcgposError(f"labels both nominal and anomalous: {', '.join(both)}")
    held = sorted({label for label in labels.values() if label})  # a short row's label is None
    missing = [
        f"{flag} {','.join(absent)}"
        for flag, names in (("--nominal", nominal), ("--anomalous", anomalous))
        if (absent := [name for name in names if name not in held])
    ]
    if missing:
        shown = ", ".join(repr(label) for label in held[:20]) + (
            f", ... ({len(held)} in all)" if len(held) > 20 else ""
        )
        raise EcgposError(
            f"--labels {path} has no record labelled {'; '.join(missing)} (its labels: {shown or 'none'})"
        )


def summary_markdown(
    run: str,
    aurocs: dict[str, float],
    counts: dict[str, int],
    nominal: list[str],
    anomalous: list[str],
    masks: int,
    notes: list[str],
    section: str = "",
) -> str:
    lines = [
        f"# Reconstruction anomaly scores: {run}",
        "",
        f"Nominal: {', '.join(nominal)} ({counts['nominal']} records); anomalous: {', '.join(anomalous)} "
        f"({counts['anomalous']} records); {counts['unlabelled']} scored records carry neither. "
        f"Scores averaged over {masks} fixed masks.",
        "",
        "| level | AUROC (anomalous vs nominal) |",
        "|---|---|",
    ]
    lines += [f"| {level} | {value:.3f} |" for level, value in aurocs.items()]
    if section:
        lines += ["", section.rstrip("\n")]
    return "\n".join(lines + [""] + [f"Note: {n}" for n in notes if n]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.masks < 1 or args.num_windows < 1 or args.batch_size < 1:
        raise EcgposError("--masks, --num-windows and --batch-size must be at least 1")
    if args.level is not None and args.level < 0:
        raise EcgposError(f"--level must be 0 or more, got {args.level}")
    if args.masks > MAX_MASKS:
        raise EcgposError(f"--masks {args.masks}: at most {MAX_MASKS} fixed masks per record")
    if args.fpr is not None and args.calibration is None:
        raise EcgposError("--fpr needs --calibration LABEL[,LABEL...]")
    args.fpr = DEFAULT_FPR if args.fpr is None else args.fpr
    labels = None
    if args.labels is not None:
        nominal, anomalous = _names(args.nominal, "--nominal"), _names(args.anomalous, "--anomalous")
        labels = read_labels(args.labels)
        check_label_names(args.labels, labels, nominal, anomalous)  # a mistyped name fails before scoring
    elif args.nominal is not None or args.anomalous is not None:
        raise EcgposError("--nominal/--anomalous need --labels CSV")
    elif args.calibration is not None:
        raise EcgposError("--calibration needs --labels CSV with --nominal and --anomalous")
    fit_labels = _calibration(args, labels, nominal, anomalous) if labels is not None else None
    if not args.input.exists() and not args.input.with_suffix(".hea").is_file():
        raise EcgposError(f"--input {args.input} does not exist")
    device = resolve_device(args.device)
    summary = summary_path(args.out)  # of this run's labels; an earlier run's is deleted without --labels
    flags = flags_path(args.out)  # likewise without --calibration
    # before any record is scored; .csv only: a CSV under `embed`'s .npy/.h5/.npz names would not read back as one
    check_writable(args.out, args.input, [summary, flags], suffixes=(".csv",))
    models = load_recon_models(args.run)
    if args.level is not None:
        if args.level >= models.depth:
            raise EcgposError(f"--level {args.level}: {args.run} has levels 0..{models.depth - 1}")
        models.levels = {name: m for name, m in models.levels.items() if name in level_names(args.level + 1)}
    if not models.levels:
        raise EcgposError(f"{args.run}: no level can be scored ({'; '.join(models.notes)})")
    if fit_labels is not None and (len(models.levels) < 2 or list(models.levels) != level_names(len(models.levels))):
        why = "".join(f"; {note}" for note in models.notes)
        raise EcgposError(
            f"--calibration needs the scores of every level (a run of level 1 or deeper, or an export of one with "
            f"decoders); {args.run} gives {', '.join(models.levels)} only{why}"
        )
    policy = ScreenPolicy(check_limb_leads=not args.keep_lead_mismatch)
    source = open_source(args.input, args.fs, args.leads, models.spec, policy)
    result = score_records(
        models, source, args.masks, args.num_windows, args.batch_size, device, progress=not args.no_progress
    )
    if not result.ids:
        listed = write_skipped(args.out, result.skipped, [summary, flags])
        raise EcgposError(
            f"none of the {source.count} {source.kind} could be scored "
            f"({len(result.skipped)} skipped, reasons above and in {listed})"
        )
    text, report, refusal = None, None, None
    if labels is not None:
        try:
            text, report = _labelled_summary(args, labels, nominal, anomalous, fit_labels, result, models.notes)
        except EcgposError as err:  # the scores are written all the same, without an earlier run's summary
            refusal = err
    levels = list(result.scores)
    listed, long = skipped_path(args.out), long_path(args.out)
    # replaced together: never another run's skipped or long list, summary or flags beside these scores
    paths = [args.out, listed, long, summary, flags]
    with written_together(args.out), atomic_paths(paths) as (tmp, skipped_tmp, long_tmp, summary_tmp, flags_tmp):
        with tmp.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["record_id"] + [f"{level}_score" for level in levels])
            for row, record_id in enumerate(result.ids):
                writer.writerow([record_id] + [f"{result.scores[level][row]:.9g}" for level in levels])
        write_skipped_rows(skipped_tmp, result.skipped)
        if result.long:
            write_long_rows(long_tmp, result.long)
        if text is not None:
            summary_tmp.write_text(text)
        if report is not None:
            write_flags(flags_tmp, result.ids, labels or {}, report)
    for note in models.notes:
        print(f"note: {note}")
    print(
        f"scored {len(result.ids)} of {source.count} {source.kind} at {', '.join(levels)} "
        f"({args.masks} masks) -> {args.out}, {listed}{skipped_note(result.skipped)}{long_note(result.long, long)}"
    )
    if refusal is not None:
        raise refusal
    if text is not None:
        print(text, end="")
        print(f"wrote {summary}" + (f", {flags}" if report is not None else ""))
    return 0


def _calibration(
    args: argparse.Namespace, labels: dict[str, str], nominal: list[str], anomalous: list[str]
) -> list[str] | None:
    """The D_fit labels of --calibration (None without it), checked against --labels before scoring."""
    if args.calibration is None:
        return None
    fit_labels = _names(args.calibration, "--calibration")
    check_target(args.fpr)
    for flag, names in (("--nominal", nominal), ("--anomalous", anomalous)):
        both = sorted(set(fit_labels) & set(names))
        if both:  # D_fit is held out: a record calibrating a threshold must not also be evaluated by it
            raise EcgposError(f"--calibration label {','.join(both)} is also a {flag} label; D_fit must be held out")
    count = sum(label in fit_labels for label in labels.values())
    check_fit_size(count, args.fpr, f"--calibration {','.join(fit_labels)} in --labels {args.labels}")
    return fit_labels


def write_flags(path: Path, ids: Sequence[str], labels: dict[str, str], report: FlagReport) -> None:
    """FILE.flags.csv: record_id,label, one 0/1 column per level's channel (level0, level1, ...), flag,
    and first_level (the first level that fired, empty when none) of every scored record."""
    names = report.levels
    first = first_fired(report.flags)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["record_id", "label", *names, "flag", "first_level"])
        for record_id, fired, level in zip(ids, report.flags, first):
            row = [record_id, labels.get(record_id, ""), *(int(f) for f in fired), int(fired.any())]
            writer.writerow(row + ["" if level < 0 else int(level)])


def _fraction(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def flags_markdown(report: FlagReport, fit_labels: list[str], nominal: list[str], flags_file: str) -> str:
    """The summary's section on the OR rule over the levels' channels."""
    cal, pooled, levels = report.calibration, report.nominal_first, report.levels
    thresholds = ", ".join(f"t_{level} = {t:.6g}" for level, t in zip(levels, cal.thresholds))
    lines = [
        f"## {len(levels)}-channel flags (OR rule)",
        "",
        "Channel l fires when the level-l score is strictly greater than its threshold t_l; a record is "
        + "flagged when any channel fires.",
        f"Calibrated on D_fit, the {cal.n_fit} records labelled {', '.join(fit_labels)}: common percentile "
        f"q* = {cal.q:.2f}, {thresholds}"
        + f"; realised false-positive rate on D_fit {cal.fit_rate:.3f} (target {cal.target:g}).",
        f"False-positive rate over the {pooled.n} nominal evaluation records: "
        f"{_fraction(pooled.share(pooled.n - pooled.neither))}.",
        "",
    ]
    head = ["label", "role", "n", *(f"Pr({level} fired)" for level in levels)]
    head += [*(f"first {level}" for level in levels), "none", "first below level0"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, d in report.first.items():
        role = "nominal" if label in nominal else "anomalous"
        shares = [_fraction(d.share(c)) for c in (*d.fired, *d.first, d.neither)]
        deeper = "—" if role == "nominal" else _fraction(d.deeper)
        lines.append(f"| {label} | {role} | {d.n} | {' | '.join(shares)} | {deeper} |")
    lines += [
        "",
        "first <level>: the share of the label's records whose first (shallowest) firing channel is that level; "
        "first below level0 = the share of flagged records that level 0 alone would miss (the appendix's "
        f"r_latent with two levels). Per-record flags: {flags_file}.",
    ]
    return "\n".join(lines) + "\n"


def _labelled_summary(
    args: argparse.Namespace,
    labels: dict[str, str],
    nominal: list[str],
    anomalous: list[str],
    fit_labels: list[str] | None,
    result: ScoreResult,
    notes: list[str],
) -> tuple[str, FlagReport | None]:
    """FILE.summary.md of the scored records, and the flags with --calibration; EcgposError when the
    labels cannot give an AUROC or the flags cannot be calibrated."""
    if not set(labels) & set(result.ids):  # the usual cause: bare names for the records of a folder
        raise EcgposError(
            f"--labels {args.labels}: none of its {len(labels)} record ids is a scored record (scored ids look "
            f"like {result.ids[0]!r}, its ids like {next(iter(labels), '')!r}; a folder's records are named by "
            f"their path below it); the scores are in {args.out}"
        )
    coverage = label_coverage(labels, result.ids, result.skipped, args.labels)
    for line in coverage:
        print(f"ecgpos score: note: {line}", file=sys.stderr)
    notes = [*notes, *coverage]
    aurocs, counts = auroc_by_level(result.ids, result.scores, labels, nominal, anomalous)
    report, section = None, ""
    if fit_labels is not None:
        report = flags_by_label(result.ids, result.scores, labels, fit_labels, nominal, anomalous, args.fpr)
        section = flags_markdown(report, fit_labels, nominal, flags_path(args.out).name)
    text = summary_markdown(str(args.run), aurocs, counts, nominal, anomalous, args.masks, notes, section)
    return text, report
