"""`ecgpos predict --model CLASSIFIER --input PATH --out predictions.csv`: each label's probability and flag.

CLASSIFIER is a classifier export folder (`ecgpos export --classifier`) or hf://ORG/NAME[@REVISION].
PATH and its records are read, screened and preprocessed exactly as `ecgpos embed` reads them
(WFDB records or folders, shard folders, `.npy` arrays with --fs and --leads; see `ecgpos embed --help`).
A record's probabilities are the sigmoid of the head applied to its features averaged over
--num-windows windows (default: the windows per record the model was evaluated with, config.json's
`windows`), and a label is flagged (1) when its probability reaches the threshold chosen on
validation (config.json's `thresholds`). FILE writes each probability exactly (the float32 value as the
shortest decimal of its double), the number the flag compares. --level is refused: a classifier is applied
whole.
FILE (`.csv`): record_id, then for each label `<label>_probability` and `<label>_flag`. Bad records
are reported on stderr with their id and reason and listed in FILE's `.skipped.csv` (record_id,
reason, detail; e.g. predictions.skipped.csv); records longer than 300 s, used on their centre 300 s,
in FILE's `.long.csv`. Exit 0 if any record was predicted (1 with --strict when any was skipped),
2 if none was.
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ecgpos.cli.embed import add_record_options, record_policy
from ecgpos.errors import EcgposError
from ecgpos.export.classifier import ExportedClassifier, load_classifier
from ecgpos.export.hub import model_ref
from ecgpos.files import atomic_paths, user_path
from ecgpos.inference.inputs import embed_records, open_source
from ecgpos.inference.outputs import (
    check_writable,
    long_note,
    long_path,
    skipped_note,
    skipped_path,
    write_long_rows,
    write_skipped,
    write_skipped_rows,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecgpos predict", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", required=True, type=model_ref, help="classifier export folder (ecgpos export --classifier) or hf://"
    )
    parser.add_argument("--out", required=True, type=user_path, help="output file .csv")
    add_record_options(
        parser,
        windows_default="the model's, from its evaluation",
        level_help="refused: a classifier's head was fine-tuned on the features of every level of its encoder; "
        "fine-tune fewer levels (`ecgpos finetune --level`) and export that classifier",
    )
    return parser


def probability_text(p: float) -> str:
    """A probability as written to FILE: the exact value the flag compares with its threshold (the float32
    probability as the shortest decimal that reads back as the same double), so the file never shows a
    probability on the other side of the threshold than its flag."""
    return repr(float(p))


def prediction_columns(labels: Sequence[str]) -> list[str]:
    """record_id, then `<label>_probability` and `<label>_flag` of each label in head order."""
    return ["record_id"] + [f"{label}_{kind}" for label in labels for kind in ("probability", "flag")]


def write_predictions(
    out: Path,
    ids: Sequence[str],
    probabilities: np.ndarray,
    model: ExportedClassifier,
    skipped: Sequence[tuple[str, str, str]],
    long: Sequence[tuple[str, str, str, str]] = (),
) -> list[Path]:
    """FILE, its `.skipped.csv` and (when a record was long) its `.long.csv`, replacing an earlier run's together."""
    flags = model.flags(probabilities)
    paths = [out, skipped_path(out)]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_paths([*paths, long_path(out)], [".csv"]) as (tmp, skipped_tmp, long_tmp):
            with tmp.open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(prediction_columns(model.labels))
                for record_id, probs, marks in zip(ids, probabilities, flags):
                    writer.writerow(
                        [record_id, *(v for p, f in zip(probs, marks) for v in (probability_text(p), int(f)))]
                    )
            write_skipped_rows(skipped_tmp, skipped)
            if long:
                write_long_rows(long_tmp, long)
    except OSError as err:
        raise EcgposError(f"cannot write {out}: {err.strerror or err}") from None
    return paths + ([long_path(out)] if long else [])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.level is not None:
        raise EcgposError(
            f"--level {args.level}: a classifier is applied whole, its head was fine-tuned on the features of "
            "every level of its encoder; fine-tune levels 0..L (`ecgpos finetune --level L`) and export that"
        )
    policy = record_policy(args)
    check_writable(args.out, args.input, suffixes=(".csv",))
    model = load_classifier(args.model, device=args.device)
    windows = args.num_windows or int(model.config.get("windows", 1) or 1)
    source = open_source(args.input, args.fs, args.leads, model.spec, policy)
    result = embed_records(
        model, source, windows, args.batch_size, progress=not args.no_progress, prog="ecgpos predict"
    )
    if not result.ids:
        listed = write_skipped(args.out, result.skipped)
        raise EcgposError(
            f"none of the {source.count} {source.kind} could be predicted "
            f"({len(result.skipped)} skipped, reasons above and in {listed})"
        )
    probabilities = model.probabilities_of_features(np.stack(result.features))
    written = write_predictions(args.out, result.ids, probabilities, model, result.skipped, result.long)
    flagged = model.flags(probabilities).sum(axis=0)
    most = ", ".join(f"{label} {int(n)}" for label, n in zip(model.labels, flagged) if n)
    print(
        f"predicted {len(model.labels)} labels for {len(result.ids)} of {source.count} {source.kind} "
        f"(flagged: {most or 'none'}) -> {', '.join(map(str, written))}"
        f"{skipped_note(result.skipped)}{long_note(result.long, long_path(args.out))}"
    )
    return 1 if args.strict and result.skipped else 0
