"""One probe run: read splits, find records, extract (or load) features, train all probes, collect rows.

Probe jobs (one per source x task x fraction, all seeds inside) run in `workers` processes with one
torch thread each: a 16-row linear step is too small for intra-op threads to pay off, so two
single-threaded processes use two cores best.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ecgpos.errors import EcgposError
from ecgpos.models.features import resolve_device
from ecgpos.probes.linear.features import FeatureSource, FeatureStats, extract_features
from ecgpos.probes.linear.train import ProtocolConfig, check_protocol, train_probe_groups
from ecgpos.probes.shared.datasets import missing_report, task_locator
from ecgpos.probes.shared.task_data import (
    RecordSettings,
    TaskData,
    check_record_settings,
    dataset_key,
    failed_line,
    fraction_rows,
    record_column,
    task_data,
    task_windows,
)
from ecgpos.probes.shared.tasks import TaskDef, read_splits
from ecgpos.workers import mapped_in_workers

SPAWN_MIN_STEPS = 20_000  # below this, starting worker processes costs more than it saves


@dataclass
class ProbeConfig:
    """Probe settings (`--config FILE`, `--set key=value`); defaults are the paper's protocol. The record
    keys and their defaults are RecordSettings'."""

    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)  # of the training labels, in (0, 1]: 0.01 is 1 %
    seeds: int = 5
    ptbxl_records: str = RecordSettings.ptbxl_records
    windows_ptbxl: int = RecordSettings.windows_ptbxl
    windows_cpsc2018: int = RecordSettings.windows_cpsc2018
    windows_csn: int = RecordSettings.windows_csn
    windows_custom: int = RecordSettings.windows_custom
    raw_fs: float = 25.0  # raw-signal baseline: block-mean downsampling rate of the centre window
    extract_batch_size: int = 64
    device: str = "auto"  # feature extraction device: auto (cuda when available), cpu, cuda, cuda:1 ...
    workers: int = 2


# More than any protocol uses (default 100): per-epoch curves of every seed are held in memory, so far
# larger counts failed in numpy (or never finished) after the features were extracted.
MAX_EPOCHS = 100_000


def check_probe_config(cfg: ProbeConfig) -> None:
    """One EcgposError line for settings that would crash later (a zero batch) or be silently replaced
    (0 windows are embedded as 1, a negative raw rate as no downsampling) while recorded as given."""
    if not 1 <= cfg.protocol.epochs <= MAX_EPOCHS:
        raise EcgposError(f"epochs={cfg.protocol.epochs}: at least 1 and at most {MAX_EPOCHS} epochs")
    check_record_settings(cfg, cfg.fractions, cfg.seeds)
    check_protocol(cfg.protocol)
    if cfg.extract_batch_size < 1:
        raise EcgposError(f"extract_batch_size={cfg.extract_batch_size}: must be at least 1")
    if not cfg.raw_fs > 0:
        raise EcgposError(f"raw_fs={cfg.raw_fs}: the raw-signal baseline's rate must be above 0 Hz")
    if cfg.workers < 0:  # 0 and 1 train in this process; below that is a typo, not a setting
        raise EcgposError(f"workers={cfg.workers}: probe training processes must be 0 or more")


def extraction_device(cfg: ProbeConfig) -> str:
    """The feature extraction device ('auto': cuda when available); EcgposError when unusable."""
    return str(resolve_device(cfg.device))


def prepare_task(
    task: TaskDef,
    source: FeatureSource,
    data_root: Path,
    splits_root: Path | None,
    cache_dir: Path,
    cfg: ProbeConfig,
    require_complete: bool = False,
    log: Callable[[str], None] = print,
    exclude: frozenset[str] | set[str] = frozenset(),
    copies: frozenset[str] | set[str] = frozenset(),
) -> tuple[TaskData, FeatureStats]:
    """Read the three splits, locate records, get features; report (or, if required, refuse) gaps.
    Records in `exclude` (pretraining overlap) are left out of every split, those in `copies` (val or test
    records whose recording an earlier split holds) out of their val or test split."""
    column = record_column(task, cfg)
    tables = read_splits(task, splits_root, column)
    locator = task_locator(task, data_root)
    missing = {s: [k for k in t.records if locator.locate(k) is None] for s, t in tables.items()}
    for split, ids in missing.items():
        if ids:
            line = missing_report(task.name, split, ids, len(tables[split].records))
            if require_complete:
                raise EcgposError(line.replace(", excluded", "") + " (--require-complete)")
            log(line)
    for split, table in tables.items():
        dropped = [k for k in table.records if k in exclude]
        if dropped:
            log(
                f"{task.name} {split}: {len(dropped)} of {len(table.records)} records overlap the pretraining "
                "data, excluded (--exclude-overlap)"
            )
        copied = [k for k in table.records if k in copies and k not in exclude]
        if copied:
            log(
                f"{task.name} {split}: {len(copied)} of {len(table.records)} records are copies of records of an "
                "earlier split, excluded (--exclude-overlap)"
            )
    wanted = [k for t in tables.values() for k in t.records]
    missing_set = {k for ids in missing.values() for k in ids} | set(exclude) | set(copies)
    feats, stats = extract_features(
        source,
        dataset_key(task, data_root, cfg),
        [k for k in wanted if k not in missing_set],
        locator,
        cache_dir,
        task_windows(cfg, task.dataset),
        log=log,
    )
    failed = {k: v for k, v in stats.failed.items() if k not in missing_set}
    if failed:
        log(failed_line(task.name, failed))
    if failed and not feats:  # nothing to probe: one line instead of a table of NaN rows
        reasons = Counter(reason.split(":")[0] for reason in failed.values())
        raise EcgposError(
            f"{task.name}: none of its {len(failed)} located records could be read "
            f"({', '.join(f'{n} {r}' for r, n in reasons.most_common())}; e.g. {next(iter(failed.items()))[1]})"
        )
    dim = len(next(iter(feats.values()))) if feats else 0

    def stack(rows: list) -> np.ndarray:
        return np.stack(rows) if rows else np.zeros((0, dim), np.float32)

    data = task_data(task, tables, missing, failed, exclude, copies, feats, stack)
    return data, stats


@dataclass
class Job:
    """Probes trained together: every group (a task's classes) on the same rows, all `seeds` batched."""

    source: str
    tasks: list[str]
    groups: list[list[str]]
    fraction: float
    arrays: tuple[np.ndarray, ...]  # x_train, y_train (N, sum of group sizes), x_val, y_val, x_test, y_test
    seeds: list[int]
    protocol: ProtocolConfig
    rows_key: str = ""  # identifies the exact train/val/test rows; equal keys may share one layer

    def cost(self) -> float:
        """Rough relative training time: rows x (classes + per-step fixed cost) x seeds."""
        return len(self.arrays[0]) * (sum(map(len, self.groups)) + 8) * len(self.seeds)


def run_job(job: Job) -> list[dict]:
    """Train one job's seeds; rows for results.csv (NaN rows with a note when it cannot train). A trained
    row also holds `scores`, its seed's (n_test, classes) test logits, for the bootstrap."""
    torch.set_num_threads(1)
    x_tr, y_tr, x_va, y_va, x_te, y_te = job.arrays
    base = {
        "encoder": job.source,
        "fraction": job.fraction,
        "n_train": len(x_tr),
        "n_val": len(x_va),
        "n_test": len(x_te),
    }
    if len(x_tr) == 0 or len(x_va) == 0 or len(x_te) == 0:
        note = "no " + "/".join(s for s, a in (("train", x_tr), ("val", x_va), ("test", x_te)) if len(a) == 0) + " rows"
        return [
            dict(
                base,
                task=t,
                seed=s,
                best_epoch=np.nan,
                val_auroc=np.nan,
                test_auroc=np.nan,
                excluded_val="",
                excluded_test="",
                test_auroc_per_class="{}",
                note=note,
            )
            for t in job.tasks
            for s in job.seeds
        ]
    outs = train_probe_groups(x_tr, y_tr, x_va, y_va, x_te, y_te, job.seeds, job.groups, job.protocol)
    positives = np.asarray(y_tr).sum(axis=0)
    rows, start = [], 0
    for task, classes, out in zip(job.tasks, job.groups, outs):
        absent = [c for c, k in zip(classes, positives[start : start + len(classes)]) if k == 0]
        start += len(classes)
        notes = [f"no positive training example: {' '.join(absent)}"] if absent else []
        if len(out.excluded_val) == len(classes):  # the table's number is then not a selected epoch's
            notes.append("no val class has positives and negatives: epoch 1 reported, no selection")
        note = "; ".join(notes)
        rows += [
            dict(
                base,
                task=task,
                seed=r.seed,
                best_epoch=r.best_epoch + 1,
                val_auroc=r.val_auroc,
                test_auroc=r.test_auroc,
                excluded_val=" ".join(out.excluded_val),
                excluded_test=" ".join(out.excluded_test),
                test_auroc_per_class=json.dumps(r.test_per_class),
                note=note,
                scores=out.test_scores[i],
            )
            for i, r in enumerate(out.seeds)
        ]
    return rows


def _rows_key(*parts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update("\n".join(part).encode())
        digest.update(b"\x00")
    return digest.hexdigest()


def make_jobs(source: str, data: TaskData, cfg: ProbeConfig) -> list[Job]:
    """One job per label fraction of a task (all seeds inside)."""
    jobs, task, seeds, x, y = [], data.task, list(range(cfg.seeds)), data.x, data.y
    for fraction in cfg.fractions:
        rows = fraction_rows(data, fraction)
        arrays = (x["train"][rows], y["train"][rows], x["val"], y["val"], x["test"], y["test"])
        key = _rows_key([data.keys["train"][i] for i in rows], data.keys["val"], data.keys["test"]) if data.keys else ""
        jobs.append(Job(source, [task.name], [list(task.classes)], fraction, arrays, seeds, cfg.protocol, key))
    return jobs


def merge_jobs(jobs: Sequence[Job]) -> list[Job]:
    """Jobs of one source and fraction on exactly the same rows (PTB-XL super and sub) become one layer
    with the tasks' columns side by side: same result, one pass over the data instead of two."""
    merged: dict[tuple, Job] = {}
    out = []
    for job in jobs:
        key = (job.source, job.fraction, job.rows_key, tuple(job.seeds), job.protocol)
        if not job.rows_key or key not in merged:
            merged[key] = dataclasses.replace(job)  # a copy: the caller's jobs stay as they were
            out.append(merged[key])
            continue
        into = merged[key]
        x_tr, y_tr, x_va, y_va, x_te, y_te = into.arrays
        _, y2_tr, _, y2_va, _, y2_te = job.arrays
        into.arrays = (
            x_tr,
            np.concatenate([y_tr, y2_tr], 1),
            x_va,
            np.concatenate([y_va, y2_va], 1),
            x_te,
            np.concatenate([y_te, y2_te], 1),
        )
        into.tasks = into.tasks + job.tasks
        into.groups = into.groups + job.groups
    return out


def _split_seeds(jobs: Sequence[Job], workers: int) -> list[Job]:
    """Split the largest jobs into seed halves so `workers` processes finish together (seeds are
    independent of the seeds they are batched with)."""
    limit = sum(j.cost() for j in jobs) / (2 * workers)
    out = []
    for job in jobs:
        if job.cost() > limit and len(job.seeds) > 1:
            half = (len(job.seeds) + 1) // 2
            out += [dataclasses.replace(job, seeds=job.seeds[:half]), dataclasses.replace(job, seeds=job.seeds[half:])]
        else:
            out.append(job)
    return out


def run_jobs(jobs: Sequence[Job], workers: int = 1) -> list[dict]:
    """All jobs (merged where they share rows), largest first, in `workers` single-threaded processes
    (in this process when workers <= 1 or the work is small). Rows by job, largest first (`sort_rows`
    orders them as results.csv does)."""
    jobs = merge_jobs(jobs)
    steps = sum(-(-len(j.arrays[0]) // j.protocol.batch_size) * j.protocol.epochs for j in jobs)
    if workers <= 1 or len(jobs) <= 1 or steps < SPAWN_MIN_STEPS:
        threads = torch.get_num_threads()
        try:
            results = [run_job(j) for j in sorted(jobs, key=lambda j: -j.cost())]
        finally:
            torch.set_num_threads(threads)
    else:
        jobs = sorted(_split_seeds(jobs, workers), key=lambda j: -j.cost())
        # spawned (no fork after torch has started its thread pools); a stop kills the running jobs, whose
        # half-trained probes are worth nothing, rather than wait minutes for them
        with mapped_in_workers(run_job, jobs, workers, finish_running=False) as results_in_order:
            results = list(results_in_order)
    return [row for rows in results for row in rows]
