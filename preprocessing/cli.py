"""`ecgpos preprocess`: raw corpora -> HDF5 shards (see preprocessing/README.md for the format)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ecgpos.config import add_set_option
from ecgpos.ecg.screening import DEFAULT_MAX_DEAD_LEADS
from ecgpos.ecg.spec import DEFAULT_SPEC, PreprocessSpec
from ecgpos.files import user_path
from ecgpos.preprocessing.build import DEFAULT_RECORDS_PER_SHARD, SOURCES, BuildRequest, check, run
from ecgpos.preprocessing.ecg_arrhythmia import DEFAULT_SUBSET, SUBSETS

EPILOG = """\
Every input record ends up either in a shard (index.csv) or in skipped.csv with a reason; the
last line says "stored X + skipped Y = found Z". Re-running into the same --out resumes an
interrupted run (even after kill -9) and leaves a finished set untouched.

SLURM / several machines: run the same command with --part I --num-parts N for I = 0..N-1
(any order, concurrently); whichever part finishes last merges index.csv, skipped.csv and
preprocess.json. A final `ecgpos preprocess --check --out DIR` verifies that the parts
together account for every record (exit 0) or names the missing chunks (exit 2).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ecgpos preprocess",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Filter, standardise and resample raw ECG corpora to 12-lead HDF5 "
        f"shards (default spec: {DEFAULT_SPEC.describe()}).",
    )
    p.add_argument("dataset", nargs="?", choices=sorted(SOURCES), help="raw corpus layout")
    p.add_argument(
        "--src",
        type=user_path,
        help="corpus root (ecg-arrhythmia: folder holding WFDBRecords/; "
        "code15: folder with exams.csv and exams_part*.hdf5)",
    )
    p.add_argument("--out", type=user_path, required=True, help="output folder for shards and index files")
    p.add_argument(
        "--subset",
        choices=sorted(SUBSETS),
        default=None,
        help=f"ecg-arrhythmia id range: ningbo JS10647-JS45551 (default {DEFAULT_SUBSET!r} is the "
        "paper's pretraining pool), chapman JS00001-JS10646, or all",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (output does not depend on it; at most 4 per CPU, or 16)",
    )
    p.add_argument(
        "--records-per-shard",
        type=int,
        default=DEFAULT_RECORDS_PER_SHARD,
        help=f"records per shard/chunk (default {DEFAULT_RECORDS_PER_SHARD})",
    )
    p.add_argument("--part", type=int, default=0, help="this process's part, 0..num-parts-1")
    p.add_argument("--num-parts", type=int, default=1, help="independent processes sharing the work")
    p.add_argument(
        "--pad-short",
        action="store_true",
        help=f"zero-pad records shorter than the {DEFAULT_SPEC.window}-sample window instead of "
        "skipping them (too_short); `length` in index.csv/shards keeps the true length",
    )
    p.add_argument(
        "--max-dead-leads",
        type=int,
        default=DEFAULT_MAX_DEAD_LEADS,
        help=f"keep records with at most this many flat (dead) leads, stored as exact zeros; "
        f"more are skipped as dead_leads (0..11, default {DEFAULT_MAX_DEAD_LEADS}; 0 skips any)",
    )
    p.add_argument(
        "--keep-lead-mismatch",
        action="store_true",
        help="keep records whose limb leads break Einthoven's or Goldberger's relations (swapped, "
        "inverted or misnamed leads) instead of skipping them (lead_mismatch)",
    )
    p.add_argument(
        "--spec",
        type=user_path,
        default=None,
        help="preprocessing spec YAML (keys fs, highpass_hz, lowpass_hz, filter_order, standardise, "
        "window, dtype), or a run config whose preprocess: section is used; default: the paper's",
    )
    add_set_option(p, "one spec key", "lowpass_hz=45")
    p.add_argument(
        "--dtype",
        choices=("float16", "float32"),
        default=None,
        help=f"storage precision of shard signals (same as --set dtype=...; default {DEFAULT_SPEC.dtype})",
    )
    p.add_argument(
        "--standardise",
        choices=("lead", "record"),
        default=None,
        help="z-score per lead (default) or over the whole record (same as --set standardise=...)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="do no work: verify that the set in --out is complete (merging it if needed)",
    )
    return p


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    if args.check:
        summary = check(args.out)
        print(f"ecgpos preprocess: {summary.line()}")
        return 0
    if args.dataset is None or args.src is None:
        build_parser().error("dataset and --src are required (unless --check)")
    subset = args.subset
    if args.dataset == "ecg-arrhythmia" and subset is None:
        subset = DEFAULT_SUBSET
    flags = [
        f"{key}={value}"
        for key, value in (("dtype", args.dtype), ("standardise", args.standardise))
        if value is not None
    ]
    spec = PreprocessSpec.load(args.spec, [*args.overrides, *flags])
    req = BuildRequest(
        dataset=args.dataset,
        src=args.src.resolve(),
        out=args.out.resolve(),
        spec=spec,
        subset=subset,
        pad_short=args.pad_short,
        max_dead_leads=args.max_dead_leads,
        keep_lead_mismatch=args.keep_lead_mismatch,
        records_per_shard=args.records_per_shard,
        workers=args.workers,
        part=args.part,
        num_parts=args.num_parts,
    )
    summary = run(req, sys.stderr)
    print(f"ecgpos preprocess: {summary.line()}")
    return 0
