"""`ecgpos score --run RUN_OR_EXPORT --input RECORDS [--masks 8] [--out scores.csv] [--labels CSV ...]`.

Per-record reconstruction anomaly scores per level (see ecgpos.inference.scoring). RUN_OR_EXPORT is
a Stage-0 or Stage-1 run folder, or an export written with `--with-decoders`. RECORDS are read
exactly as `ecgpos embed` reads them: a WFDB record or folder, a shard folder or file, or a `.npy`
array with --fs and --leads; bad records are reported with their reason and skipped.
Writes --out (a .csv file) with columns record_id,stage0_score[,stage1_score] (a Stage-0 run has
Stage-0 scores only), and FILE's `.skipped.csv` (record_id, reason, detail) as `embed` does.
With --labels CSV (record_id,label) and --nominal/--anomalous: the AUROC of anomalous vs nominal
per level (higher score = more anomalous), printed and written to FILE's `.summary.md` (scores.summary.md).
These files are replaced together: a run without --labels deletes an earlier run's FILE.summary.md,
and a run that scored no record writes the skipped list and deletes the earlier scores and summary.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

from ecgpos.errors import EcgposError
from ecgpos.files import atomic_paths, user_path
from ecgpos.inference.inputs import (
    check_writable,
    open_source,
    skipped_note,
    skipped_path,
    write_skipped,
    write_skipped_rows,
)
from ecgpos.inference.scoring import MAX_MASKS, ScoreResult, auroc_by_level, load_recon_models, score_records
from ecgpos.models.features import resolve_device


def summary_path(out: Path) -> Path:
    """Where the labelled AUROC summary of --out FILE goes: FILE's name with `.summary.md`, so runs
    written side by side into one folder each keep their own."""
    return out.with_name(f"{out.stem}.summary.md")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos score", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--run", required=True, type=user_path, help="Stage-0/Stage-1 run folder or export with decoders")
    p.add_argument("--input", required=True, type=user_path, help="WFDB record/folder, shard folder or .npy")
    p.add_argument(
        "--masks", type=int, default=8, help=f"fixed masks averaged per record (default 8, at most {MAX_MASKS})"
    )
    p.add_argument("--out", type=user_path, default=Path("scores.csv"), help="output .csv file (default scores.csv)")
    p.add_argument("--labels", type=user_path, help="CSV record_id,label (record_id as in scores.csv)")
    p.add_argument("--nominal", help="comma-separated nominal labels (with --labels)")
    p.add_argument("--anomalous", help="comma-separated anomalous labels (with --labels)")
    p.add_argument("--fs", type=float, help="sampling rate of a .npy input (Hz)")
    p.add_argument("--leads", help="comma-separated lead names of a .npy input's rows")
    p.add_argument("--num-windows", type=int, default=1, help="windows per record, averaged (default 1: centre)")
    p.add_argument("--batch-size", type=int, default=64, help="windows per forward pass (default 64)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _names(text: str | None, flag: str) -> list[str]:
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if not names:
        raise EcgposError(f"--labels needs {flag} A[,B...]")
    return names


def read_labels(path: Path) -> dict[str, str]:
    """record_id -> label from a CSV with those two columns."""
    if not path.is_file():
        raise EcgposError(f"--labels {path} does not exist")
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            if not reader.fieldnames or not {"record_id", "label"} <= set(reader.fieldnames):
                raise EcgposError(f"--labels {path}: needs columns record_id,label (found {reader.fieldnames})")
            return {row["record_id"]: row["label"] for row in reader}
    except (UnicodeDecodeError, csv.Error) as err:
        raise EcgposError(f"--labels {path} is not a readable CSV: {err}") from None


def summary_markdown(
    run: str,
    aurocs: dict[str, float],
    counts: dict[str, int],
    nominal: list[str],
    anomalous: list[str],
    masks: int,
    notes: list[str],
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
    return "\n".join(lines + [""] + [f"Note: {n}" for n in notes if n]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.masks < 1 or args.num_windows < 1 or args.batch_size < 1:
        raise EcgposError("--masks, --num-windows and --batch-size must be at least 1")
    if args.masks > MAX_MASKS:
        raise EcgposError(f"--masks {args.masks}: at most {MAX_MASKS} fixed masks per record")
    labels = None
    if args.labels is not None:
        nominal, anomalous = _names(args.nominal, "--nominal"), _names(args.anomalous, "--anomalous")
        labels = read_labels(args.labels)
        for flag, names in (("--nominal", nominal), ("--anomalous", anomalous)):
            if not set(names) & set(labels.values()):  # AUROC needs both sides: say so before scoring
                raise EcgposError(f"--labels {args.labels} has no record labelled {flag} {','.join(names)}")
    elif args.nominal is not None or args.anomalous is not None:
        raise EcgposError("--nominal/--anomalous need --labels CSV")
    if not args.input.exists() and not args.input.with_suffix(".hea").is_file():
        raise EcgposError(f"--input {args.input} does not exist")
    device = resolve_device(args.device)
    summary = summary_path(args.out)  # of this run's labels; an earlier run's is deleted without --labels
    # before any record is scored; .csv only: a CSV under `embed`'s .npy/.h5/.npz names would not read back as one
    check_writable(args.out, args.input, [summary], suffixes=(".csv",))
    models = load_recon_models(args.run)
    if not models.levels:
        raise EcgposError(f"{args.run}: no level can be scored ({'; '.join(models.notes)})")
    source = open_source(args.input, args.fs, args.leads, models.spec)
    result = score_records(
        models, source, args.masks, args.num_windows, args.batch_size, device, progress=not args.no_progress
    )
    if not result.ids:
        listed = write_skipped(args.out, result.skipped, [summary])
        raise EcgposError(
            f"none of the {source.count} {source.kind} could be scored "
            f"({len(result.skipped)} skipped, reasons above and in {listed})"
        )
    text, refusal = None, None
    if labels is not None:
        try:
            text = _labelled_summary(args, labels, nominal, anomalous, result, models.notes)
        except EcgposError as err:  # the scores are written all the same, without an earlier run's summary
            refusal = err
    levels = list(result.scores)
    listed = skipped_path(args.out)
    # replaced together: never another run's skipped list or summary beside these scores
    with atomic_paths([args.out, listed, summary]) as (tmp, skipped_tmp, summary_tmp):
        with tmp.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["record_id"] + [f"{level}_score" for level in levels])
            for row, record_id in enumerate(result.ids):
                writer.writerow([record_id] + [f"{result.scores[level][row]:.9g}" for level in levels])
        write_skipped_rows(skipped_tmp, result.skipped)
        if text is not None:
            summary_tmp.write_text(text)
    for note in models.notes:
        print(f"note: {note}")
    print(
        f"scored {len(result.ids)} of {source.count} {source.kind} at {', '.join(levels)} "
        f"({args.masks} masks) -> {args.out}, {listed}{skipped_note(result.skipped)}"
    )
    if refusal is not None:
        raise refusal
    if text is not None:
        print(text, end="")
        print(f"wrote {summary}")
    return 0


def _labelled_summary(
    args: argparse.Namespace,
    labels: dict[str, str],
    nominal: list[str],
    anomalous: list[str],
    result: ScoreResult,
    notes: list[str],
) -> str:
    """FILE.summary.md of the scored records; EcgposError when the labels cannot give an AUROC."""
    if not set(labels) & set(result.ids):  # the usual cause: bare names for the records of a folder
        raise EcgposError(
            f"--labels {args.labels}: none of its {len(labels)} record ids is a scored record (scored ids look "
            f"like {result.ids[0]!r}, its ids like {next(iter(labels), '')!r}; a folder's records are named by "
            f"their path below it); the scores are in {args.out}"
        )
    aurocs, counts = auroc_by_level(result.ids, result.scores, labels, nominal, anomalous)
    return summary_markdown(str(args.run), aurocs, counts, nominal, anomalous, args.masks, notes)
