"""`ecgpos embed --encoder DIR --input PATH --out FILE`: features of many records with an export.

PATH is one of
- a WFDB record (`.../JS00001`, with or without `.hea`) or a folder searched recursively for `*.hea`
  (symlinked folders followed, each real folder once); record ids are the record name (single
  record) or the path relative to the folder, no suffix;
- an HDF5 shard folder written by `ecgpos preprocess` (`shard-*.h5`), or one shard file: its
  stored signals are already preprocessed, so only the spec is checked against the encoder's and
  windows are cut exactly as in evaluation (centre window, or `--num-windows` spread windows;
  a record stored zero-padded by --pad-short is used padded, as pretraining saw it);
  ids from `record_id`;
- a `.npy` array (leads, time) or (N, leads, time) in mV with `--fs` and `--leads`; ids are the file
  stem (2-D) or the row index (3-D).
A raw record longer than 300 s at its own rate (a Holter recording) is read, screened, filtered and
z-scored on its centre 300 s span alone, and `--num-windows` spreads its windows over that span:
memory stays bounded whatever the record's length (`ecgpos.ecg.signal.record_span`). The closing
line counts such records and FILE's `.long.csv` (e.g. feats.long.csv; written only when there is
one) lists them: record_id, duration_s (the whole record), used_from_s, used_to_s (the span used).
FILE by suffix: `.csv` (record_id, f0..f{D-1}), `.h5` (datasets `features`, `record_id`),
`.npz` (arrays `features`, `record_id`) or `.npy` (features only, ids one per line in FILE with
suffix `.ids.txt` beside it, since .npy holds a single array); shard inputs and `.h5` need h5py
(`pip install 'ecgpos[train]'`). Raw records go through the record screening of preprocessing
(`ecgpos.ecg.screening`), and an id holding a control character (a line break, a tab) is skipped as
`bad_record_id`: bad records are reported on stderr with their id and reason, listed in
FILE's `.skipped.csv` (record_id, reason, detail; e.g. feats.skipped.csv) and the others are still
embedded; exit 0 if any record was embedded (1 with --strict when any was skipped), 2 if none was
(then FILE.skipped.csv is written and an earlier run's FILE, FILE.ids.txt and FILE.long.csv are
deleted; a run with no record longer than 300 s deletes an earlier FILE.long.csv too).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from ecgpos.ecg.screening import DEFAULT_MAX_DEAD_LEADS, ScreenPolicy
from ecgpos.errors import EcgposError
from ecgpos.export.hub import model_ref
from ecgpos.export.load import load_encoder
from ecgpos.extras import require
from ecgpos.files import user_path
from ecgpos.inference.inputs import embed_records, open_source
from ecgpos.inference.outputs import (
    OUTPUT_SUFFIXES,
    check_writable,
    long_note,
    long_path,
    skipped_note,
    write_features,
    write_skipped,
)
from ecgpos.models.features import DEFAULT_NUM_WINDOWS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ecgpos embed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--encoder", required=True, type=model_ref, help="export folder (ecgpos export) or hf://ORG/NAME"
    )
    parser.add_argument("--out", required=True, type=user_path, help=f"output file {'/'.join(OUTPUT_SUFFIXES)}")
    add_record_options(parser)
    return parser


def add_record_options(
    parser: argparse.ArgumentParser,
    windows_default: str = "1: the centre window",
    level_help: str = "features of levels 0..LEVEL of a nested export (default: the top level)",
) -> None:
    """The options that say which records are read and how: shared by `ecgpos embed` and `ecgpos predict`
    (whose --num-windows defaults to None: the model's own, `windows_default` says so; its --level is refused,
    `level_help` says why)."""
    parser.add_argument("--input", required=True, type=user_path, help="WFDB record/folder, shard folder or .npy")
    parser.add_argument("--fs", type=float, default=None, help="sampling rate of a .npy input (Hz)")
    parser.add_argument("--leads", default=None, help="comma-separated lead names of a .npy input's rows")
    parser.add_argument(
        "--num-windows",
        type=int,
        default=DEFAULT_NUM_WINDOWS if windows_default.startswith("1:") else None,
        help=f"windows per record, spread evenly and averaged (default {windows_default}); "
        "over the centre 300 s of a longer record",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="windows per forward pass (default 64)")
    parser.add_argument("--level", type=int, default=None, help=level_help)
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda (default cpu)")
    parser.add_argument(
        "--pad-short",
        action="store_true",
        help="zero-pad raw records shorter than one window instead of skipping them (too_short), "
        "as `ecgpos preprocess --pad-short` and the probes do",
    )
    parser.add_argument(
        "--max-dead-leads",
        type=int,
        default=DEFAULT_MAX_DEAD_LEADS,
        help=f"skip raw records with more flat (dead) leads than this, as preprocessing does "
        f"(default {DEFAULT_MAX_DEAD_LEADS})",
    )
    parser.add_argument(
        "--keep-lead-mismatch",
        action="store_true",
        help="keep records whose limb leads break Einthoven's or Goldberger's relations (swapped, "
        "inverted or misnamed leads) instead of skipping them (lead_mismatch), as "
        "`ecgpos preprocess --keep-lead-mismatch` does",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when any record was skipped")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def record_policy(args: argparse.Namespace) -> ScreenPolicy:
    """The record options checked (one line each) and their screening policy."""
    if (args.num_windows is not None and args.num_windows < 1) or args.batch_size < 1:
        raise EcgposError("--num-windows and --batch-size must be at least 1")
    if not args.input.exists() and not args.input.with_suffix(".hea").is_file():
        raise EcgposError(f"--input {args.input} does not exist")
    return ScreenPolicy(  # ConfigError if bad
        pad_short=args.pad_short,
        max_dead_leads=args.max_dead_leads,
        check_limb_leads=not args.keep_lead_mismatch,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.out.suffix not in OUTPUT_SUFFIXES:
        raise EcgposError(f"--out {args.out}: suffix must be one of {', '.join(OUTPUT_SUFFIXES)}")
    if args.out.suffix == ".h5":
        require("h5py")  # before any record is embedded
    policy = record_policy(args)
    check_writable(args.out, args.input)
    encoder = load_encoder(args.encoder, device=args.device).cut(args.level)
    source = open_source(args.input, args.fs, args.leads, encoder.spec, policy)
    result = embed_records(encoder, source, args.num_windows, args.batch_size, progress=not args.no_progress)
    if not result.ids:
        listed = write_skipped(args.out, result.skipped)
        raise EcgposError(
            f"none of the {source.count} {source.kind} could be embedded "
            f"({len(result.skipped)} skipped, reasons above and in {listed})"
        )
    features = np.stack(result.features).astype(np.float32)
    written = write_features(args.out, result.ids, features, encoder, result.skipped, result.long)
    print(
        f"embedded {len(result.ids)} of {source.count} {source.kind} ({features.shape[1]} features) -> "
        f"{', '.join(map(str, written))}{skipped_note(result.skipped)}{long_note(result.long, long_path(args.out))}"
    )
    return 1 if args.strict and result.skipped else 0
