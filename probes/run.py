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
from ecgpos.workers import mapped_in_workers
from probes.datasets import missing_report, task_locator
from probes.features import FeatureSource, FeatureStats, extract_features
from probes.linear import ProtocolConfig, check_protocol, label_fraction_rows, train_probe_groups
from probes.tasks import TaskDef, read_splits

SPAWN_MIN_STEPS = 20_000  # below this, starting worker processes costs more than it saves


@dataclass
class ProbeConfig:
    """Probe settings (`--config FILE`, `--set key=value`); defaults are the paper's protocol."""

    protocol: ProtocolConfig = field(default_factory=ProtocolConfig)
    fractions: tuple[float, ...] = (0.01, 0.1, 1.0)  # of the training labels, in (0, 1]: 0.01 is 1 %
    seeds: int = 5
    ptbxl_records: str = "records500"  # or records100 (reads filename_lr)
    # windows of spec.window samples embedded per record and averaged (spread evenly, at least half a
    # window apart; a record shorter than one window is zero-padded at the end). CPSC records are
    # 6-60 s (up to 6 windows at 250 Hz), PTB-XL records are 10 s (one centred 9 s window).
    windows_ptbxl: int = 1
    windows_cpsc2018: int = 4
    windows_csn: int = 1  # ecg-arrhythmia records are 10 s
    windows_custom: int = 1
    raw_fs: float = 25.0  # raw-signal baseline: block-mean downsampling rate of the centre window
    extract_batch_size: int = 64
    device: str = "auto"  # feature extraction device: auto (cuda when available), cpu, cuda, cuda:1 ...
    workers: int = 2


@dataclass
class TaskData:
    """Features and labels of one task for one source, with what was left out and why."""

    task: TaskDef
    x: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    train_positions: np.ndarray  # row of each kept train sample in the full train CSV
    n_full_train: int
    missing: dict[str, list[str]]
    failed: dict[str, str]
    keys: dict[str, list[str]] = field(default_factory=dict)  # record key of every kept row, per split
    # split -> RECORD_COUNTS: every row of the split file is in exactly one of the last five
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    patients: dict[str, list[str]] = field(default_factory=dict)  # patient of every kept row, where named


# what became of a split file's rows: listed = not_found + refused + overlap + split_copy + probed
# (overlap: matches a pretraining record; split_copy: a val or test copy of an earlier split's record)
RECORD_COUNTS = ("listed", "not_found", "refused", "overlap", "split_copy", "probed")
WINDOW_DATASETS = ("ptbxl", "cpsc2018", "csn", "custom")  # ProbeConfig.windows_<dataset>


def failed_line(task_name: str, failed: dict[str, str]) -> str:
    """The log line naming (the first five of) a task's records that failed to read."""
    ids = sorted(failed)
    head = "; ".join(f"{k} ({failed[k]})" for k in ids[:5])
    return f"{task_name}: {len(ids)} records failed to read and are excluded: {head}{' ...' if len(ids) > 5 else ''}"


def task_data(
    task: TaskDef,
    tables: dict,
    missing: dict[str, list[str]],
    failed: dict[str, str],
    exclude: frozenset[str] | set[str],
    copies: frozenset[str] | set[str],
    values: dict[str, object],
    stack: Callable[[list], np.ndarray],
) -> TaskData:
    """TaskData of the rows whose record has a value (`values`: record key -> features or signal), stacked
    per split by `stack`; every split row counted in exactly one of RECORD_COUNTS."""
    x, y, keys, counts, patients, positions = {}, {}, {}, {}, {}, np.zeros(0, int)
    for split, table in tables.items():
        keep = np.array([k in values for k in table.records], dtype=bool)
        keys[split] = [k for k, ok in zip(table.records, keep) if ok]
        if table.patients is not None:
            patients[split] = [p for p, ok in zip(table.patients, keep) if ok]
        not_found = set(missing[split])
        counts[split] = {
            "listed": len(table.records),
            "not_found": len(missing[split]),  # rows, not ids: blank record cells are each a row
            "refused": sum(k in failed for k in table.records),
            "overlap": sum(k in exclude and k not in not_found for k in table.records),
            "split_copy": sum(k in copies and k not in exclude and k not in not_found for k in table.records),
            "probed": int(keep.sum()),
        }
        x[split] = stack([values[k] for k in keys[split]])
        y[split] = table.labels[keep]
        if split == "train":
            positions = np.flatnonzero(keep)
    return TaskData(task, x, y, positions, len(tables["train"].records), missing, failed, keys, counts, patients)


# More than any protocol uses (defaults 5 and 100): per-epoch curves of every seed are held in memory,
# so far larger counts failed in numpy (or never finished) after the features were extracted.
MAX_SEEDS = 1_000
MAX_EPOCHS = 100_000


def check_probe_config(cfg: ProbeConfig) -> None:
    """One EcgposError line for settings that would crash later (a zero batch) or be silently replaced
    (0 windows are embedded as 1, a negative raw rate as no downsampling) while recorded as given."""
    if cfg.seeds < 1 or cfg.protocol.epochs < 1:
        raise EcgposError("seeds and epochs must be at least 1")
    if cfg.seeds > MAX_SEEDS or cfg.protocol.epochs > MAX_EPOCHS:
        raise EcgposError(
            f"seeds={cfg.seeds}, epochs={cfg.protocol.epochs}: at most {MAX_SEEDS} seeds and {MAX_EPOCHS} epochs"
        )
    check_protocol(cfg.protocol)
    # a fraction above 1 would train on all labels under a "1000%" heading (percent given where the
    # config takes fractions), 0 on none; a repeated one would train the same probes twice
    fractions = [float(f) for f in cfg.fractions]
    if not fractions or any(not 0 < f <= 1 for f in fractions) or len(set(fractions)) < len(fractions):
        raise EcgposError(
            f"fractions={fractions}: label fractions must be distinct numbers in (0, 1], "
            "e.g. [0.01, 0.1, 1] (--fractions takes percentages: 1,10,100)"
        )
    counts = {k: getattr(cfg, k) for k in ("extract_batch_size", *(f"windows_{d}" for d in WINDOW_DATASETS))}
    bad = [f"{k}={v}" for k, v in counts.items() if v < 1]
    if bad:
        raise EcgposError(f"{', '.join(bad)}: must be at least 1")
    if not cfg.raw_fs > 0:
        raise EcgposError(f"raw_fs={cfg.raw_fs}: the raw-signal baseline's rate must be above 0 Hz")
    if cfg.workers < 0:  # 0 and 1 train in this process; below that is a typo, not a setting
        raise EcgposError(f"workers={cfg.workers}: probe training processes must be 0 or more")


def extraction_device(cfg: ProbeConfig) -> str:
    """The feature extraction device ('auto': cuda when available); EcgposError when unusable."""
    return str(resolve_device(cfg.device))


def task_windows(cfg: ProbeConfig, dataset: str) -> int:
    return {"ptbxl": cfg.windows_ptbxl, "cpsc2018": cfg.windows_cpsc2018, "csn": cfg.windows_csn}.get(
        dataset, cfg.windows_custom
    )


def dataset_key(task: TaskDef, data_root: Path, cfg: ProbeConfig) -> str:
    if task.dataset == "custom":
        return f"custom:{Path(task.files['train']).parent}"
    extra = f"/{cfg.ptbxl_records}" if task.dataset == "ptbxl" else ""
    return f"{task.dataset}:{data_root.resolve()}{extra}"


def record_column(task: TaskDef, cfg: ProbeConfig) -> str | None:
    if task.dataset == "ptbxl":
        if cfg.ptbxl_records not in ("records500", "records100"):
            raise EcgposError(f"ptbxl_records must be records500 or records100, got {cfg.ptbxl_records!r}")
        return "filename_lr" if cfg.ptbxl_records == "records100" else "filename_hr"
    return None


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


def fraction_rows(data: TaskData, fraction: float) -> np.ndarray:
    """Rows of data.x['train'] in the label-fraction subset: MERL's subset of the full train CSV,
    restricted to the records present (in the subset's order)."""
    subset = label_fraction_rows(data.n_full_train, fraction)
    where = {int(p): i for i, p in enumerate(data.train_positions)}
    return np.array([where[int(p)] for p in subset if int(p) in where], dtype=int)


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


def sort_rows(rows: Sequence[dict], sources: Sequence[str], tasks: Sequence[str]) -> list[dict]:
    """results.csv order: source, task (as asked), fraction, seed."""
    return sorted(
        rows, key=lambda r: (list(sources).index(r["encoder"]), list(tasks).index(r["task"]), r["fraction"], r["seed"])
    )
