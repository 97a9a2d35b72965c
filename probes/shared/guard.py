"""The leakage guard as `ecgpos probe` and `ecgpos finetune` run it, before any record is read for training:
each task's splits against the encoder's pretraining shards (ecgpos.probes.shared.leakage), and the cache folder
its fingerprints (and the probe's features) are kept in."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ecgpos.errors import EcgposError
from ecgpos.probes.shared.datasets import task_locator
from ecgpos.probes.shared.leakage import load_pretraining, overlap_markdown, recorded_pretraining, task_overlap
from ecgpos.probes.shared.task_data import RecordKeys, dataset_key, record_column
from ecgpos.probes.shared.tasks import GUARDED_TASKS, read_splits

GUARD_NOT_RUN = (
    "the encoder records no pretraining shards and no --pretraining-index was given, so neither overlap with "
    "pretraining records nor one recording in two splits under two file names was checked"
)


def leakage_guard(args: argparse.Namespace, enc, tasks, cfg: RecordKeys, cache_dir: Path, log) -> tuple[list, str]:
    """The leakage guard over the tasks' splits as `cfg` reads them: (overlaps per task, summary section); no
    overlaps, and a section saying so, when there is no pretraining index. `args` holds the flags both
    commands share: --encoder, --pretraining-index, --exclude-overlap, --data-root, --splits."""
    folders = args.pretraining_index or recorded_pretraining(enc.source, enc.info)
    guarded = [t.name for t in tasks if t.name in GUARDED_TASKS]
    if not folders:
        if guarded and not args.encoder.startswith("random:"):
            raise EcgposError(
                f"--task {guarded[0]} draws its records from ecg-arrhythmia, which the encoder may "
                "have been pretrained on: give --pretraining-index SHARDS (the encoder records no "
                "pretraining shards)"
            )
        if args.exclude_overlap:
            raise EcgposError("--exclude-overlap needs --pretraining-index (the encoder records no pretraining shards)")
        print(f"leakage guard: not run ({GUARD_NOT_RUN})")
        return [], f"## Pretraining overlap (leakage guard)\n\nNot run: {GUARD_NOT_RUN}."
    index = load_pretraining(folders, log)
    overlaps = []
    for task in tasks:
        column = record_column(task, cfg)
        splits = {s: t.records for s, t in read_splits(task, args.splits, column).items()}
        overlap = task_overlap(
            task.name,
            splits,
            task_locator(task, args.data_root or Path(".")),
            index,
            cache_dir,
            dataset_key(task, args.data_root or Path("."), cfg),
        )
        overlaps.append(overlap)
        print(f"leakage guard: {overlap.line(args.exclude_overlap)}")
        print(f"leakage guard: {overlap.copy_line(args.exclude_overlap)}")
    return overlaps, overlap_markdown(index, overlaps, args.exclude_overlap)


def cache_folder(args: argparse.Namespace) -> Path:
    """--cache-dir, else $ECGPOS_CACHE/probe-features (~/.cache/ecgpos): the feature and fingerprint cache."""
    default = Path(os.environ.get("ECGPOS_CACHE", Path.home() / ".cache" / "ecgpos")) / "probe-features"
    return args.cache_dir or default
